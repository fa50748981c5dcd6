// The official @aws-sdk/client-bedrock-agentcore's side of bench/agentcore.lua: against the
// Code Interpreter stand-in the Lua side serves (STAND_IN_URL), the time to a first command
// (StartCodeInterpreterSession, then executeCommand 'true'; the stop after it is not timed) and of
// executeCommand 'true' in one session (bench/_sdk_timing.mjs). Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { firstAndExec } from './_sdk_timing.mjs';

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

await firstAndExec({
  open: async () => (await client.send(new StartCodeInterpreterSessionCommand({
    codeInterpreterIdentifier: CI, sessionTimeoutSeconds: 600 }))).sessionId,
  exec: async (sessionId) => {
    const out = await client.send(new InvokeCodeInterpreterCommand({ codeInterpreterIdentifier: CI, sessionId,
      name: 'executeCommand', arguments: { command: 'true' } }));
    for await (const ev of out.stream) {
      if (!ev.result || ev.result.structuredContent.exitCode !== 0) throw new Error('true failed');
    }
  },
  close: (sessionId) => client.send(new StopCodeInterpreterSessionCommand({ codeInterpreterIdentifier: CI,
    sessionId })),
});
