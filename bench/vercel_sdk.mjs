// The official @vercel/sandbox SDK's side of bench/vercel.lua: against the Vercel stand-in the
// Lua side serves (STAND_IN_URL), the median time to a first command (Sandbox.create, then
// runCommand('true'); the stop and delete after it are not timed) over N_FIRST runs, and of
// runCommand('true') in one sandbox over N_EXEC runs, each after two untimed ones. Prints
// `RESULT {"first_ms":..,"exec_ms":..}`. The SDK is the one the specs install (spec/npm).
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { Sandbox } = require('@vercel/sandbox');

const SERVICE = 'https://vercel.com/api';
const base = process.env.STAND_IN_URL;
const options = {
  token: process.env.STAND_IN_TOKEN, teamId: process.env.STAND_IN_TEAM, projectId: process.env.STAND_IN_PROJECT,
  fetch: (input, init) => fetch(base + String(input).slice(SERVICE.length), init),
  timeout: 600000, networkPolicy: 'deny-all',
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

const first = await timed(Number(process.env.N_FIRST), async () => {
  const t0 = performance.now();
  const sandbox = await Sandbox.create(options);
  await sandbox.runCommand('true');
  const ms = performance.now() - t0;
  await sandbox.stop();
  await sandbox.delete();
  return ms;
});

const sandbox = await Sandbox.create(options);
const exec = await timed(Number(process.env.N_EXEC), async () => {
  const t0 = performance.now();
  const r = await sandbox.runCommand('true');
  if (r.exitCode !== 0) throw new Error('true failed');
  return performance.now() - t0;
});
await sandbox.stop();
await sandbox.delete();
console.log('RESULT ' + JSON.stringify({ first_ms: first, exec_ms: exec }));
