// The official @codesandbox/sdk's side of bench/codesandbox.lua: against the CodeSandbox
// stand-in the Lua side serves (STAND_IN_URL, its pitcher front started by the Lua side), the
// median time to a first command (sandboxes.create, connect, commands.run('true'); the delete
// after it is not timed) over N_FIRST runs, and of commands.run('true') in one sandbox over
// N_EXEC runs, each after two untimed ones. Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { CodeSandbox } = require('@codesandbox/sdk');

const sdk = new CodeSandbox(process.env.CSB_TOKEN, { baseUrl: process.env.STAND_IN_URL });

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

async function open() {
  const sandbox = await sdk.sandboxes.create({ hibernationTimeoutSeconds: 600 });
  return { sandbox, client: await sandbox.connect() };
}

async function close({ sandbox, client }) {
  client.dispose();
  await sdk.sandboxes.delete(sandbox.id);
}

const first = await timed(Number(process.env.N_FIRST), async () => {
  const t0 = performance.now();
  const s = await open();
  await s.client.commands.run('true');
  const ms = performance.now() - t0;
  await close(s);
  return ms;
});
const s = await open();
const execMs = await timed(Number(process.env.N_EXEC), async () => {
  const t0 = performance.now();
  await s.client.commands.run('true');
  return performance.now() - t0;
});
await close(s);
console.log('RESULT ' + JSON.stringify({ first_ms: first, exec_ms: execMs }));
process.exit(0);
