// The official @aws-sdk/client-bedrock-agentcore's side of bench/agentcore.lua: against the
// Code Interpreter stand-in the Lua side serves (STAND_IN_URL), the median time to a first
// command (StartCodeInterpreterSession, then executeCommand 'true'; the stop after it is not
// timed) over N_FIRST runs, and of executeCommand 'true' in one session over N_EXEC runs, each
// after two untimed ones. Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const {
  BedrockAgentCoreClient, StartCodeInterpreterSessionCommand, InvokeCodeInterpreterCommand,
  StopCodeInterpreterSessionCommand,
} = require('@aws-sdk/client-bedrock-agentcore');

const CI = 'aws.codeinterpreter.v1';
const client = new BedrockAgentCoreClient({
  endpoint: process.env.STAND_IN_URL, region: process.env.AWS_REGION, maxAttempts: 1,
  credentials: { accessKeyId: process.env.AWS_KEY_ID, secretAccessKey: process.env.AWS_SECRET },
});

function median(xs) {
  xs.sort((a, b) => a - b);
  const n = xs.length;
  return n % 2 ? xs[(n - 1) / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

async function timed(n, fn) {
  for (let i = 0; i < 2; i++) await fn();
  const xs = [];
  for (let i = 0; i < n; i++) xs.push(await fn());
  return median(xs);
}

async function exec(sessionId) {
  const out = await client.send(new InvokeCodeInterpreterCommand({ codeInterpreterIdentifier: CI, sessionId,
    name: 'executeCommand', arguments: { command: 'true' } }));
  for await (const ev of out.stream) {
    if (!ev.result || ev.result.structuredContent.exitCode !== 0) throw new Error('true failed');
  }
}

const start = async () => (await client.send(new StartCodeInterpreterSessionCommand({
  codeInterpreterIdentifier: CI, sessionTimeoutSeconds: 600 }))).sessionId;
const stop = (sessionId) => client.send(new StopCodeInterpreterSessionCommand({ codeInterpreterIdentifier: CI,
  sessionId }));

const first = await timed(Number(process.env.N_FIRST), async () => {
  const t0 = performance.now();
  const id = await start();
  await exec(id);
  const ms = performance.now() - t0;
  await stop(id);
  return ms;
});
const id = await start();
const execMs = await timed(Number(process.env.N_EXEC), async () => {
  const t0 = performance.now();
  await exec(id);
  return performance.now() - t0;
});
await stop(id);
console.log('RESULT ' + JSON.stringify({ first_ms: first, exec_ms: execMs }));
