// The official `railway` SDK's side of bench/railway.lua: against the Railway stand-in and its
// exec bridge the Lua side serves (STAND_IN_URL, STAND_IN_WS), the median time to a first
// command (Sandbox.create, then exec 'true'; the destroy after it is not timed) over N_FIRST
// runs, and of exec 'true' in one sandbox over N_EXEC runs, each after two untimed ones. Prints
// `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { Sandbox } = await import(require.resolve('railway'));
const WebSocket = require('ws');

const options = {
  endpoint: process.env.STAND_IN_URL, tcpProxyWsEndpoint: process.env.STAND_IN_WS, webSocketImpl: WebSocket,
  token: process.env.STAND_IN_TOKEN, environmentId: process.env.STAND_IN_ENV,
};

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

async function exec(sb) {
  const r = await sb.exec('true');
  if (r.exitCode !== 0) throw new Error('true failed');
}

const first = await timed(Number(process.env.N_FIRST), async () => {
  const t0 = performance.now();
  const sb = await Sandbox.create({ ...options });
  await exec(sb);
  const ms = performance.now() - t0;
  await sb.destroy();
  return ms;
});
const sb = await Sandbox.create({ ...options });
const execMs = await timed(Number(process.env.N_EXEC), async () => {
  const t0 = performance.now();
  await exec(sb);
  return performance.now() - t0;
});
await sb.destroy();
console.log('RESULT ' + JSON.stringify({ first_ms: first, exec_ms: execMs }));
process.exit(0);
