// The official `e2b` SDK's side of bench/e2b.lua, against the E2B stand-in the bench serves:
// the median time to a first command (Sandbox.create, then commands.run('true')) over CREATES
// sandboxes, and of a command's round trip (commands.run('true')) over EXECS runs. Two of each
// first, untimed. Prints one JSON line { first_ms, exec_ms }.
import { Sandbox } from 'e2b';

const opts = {
  apiKey: process.env.E2B_API_KEY,
  apiUrl: process.env.E2B_API_URL,
  sandboxUrl: process.env.E2B_SANDBOX_URL,
  requestTimeoutMs: 60000,
};
const creates = Number(process.env.CREATES ?? 8);
const execs = Number(process.env.EXECS ?? 40);

const median = (xs) => {
  xs.sort((a, b) => a - b);
  const n = xs.length;
  return n % 2 ? xs[(n - 1) / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
};

async function first() {
  const t0 = performance.now();
  const sbx = await Sandbox.create('base', { ...opts, timeoutMs: 600000, allowInternetAccess: false });
  await sbx.commands.run('true');
  const ms = performance.now() - t0;
  await sbx.kill();
  return ms;
}

const firsts = [];
for (let i = 0; i < creates + 2; i++) {
  const ms = await first();
  if (i >= 2) firsts.push(ms);
}
const sbx = await Sandbox.create('base', { ...opts, timeoutMs: 600000, allowInternetAccess: false });
const runs = [];
for (let i = 0; i < execs + 2; i++) {
  const t0 = performance.now();
  await sbx.commands.run('true');
  if (i >= 2) runs.push(performance.now() - t0);
}
await sbx.kill();
console.log(JSON.stringify({ first_ms: median(firsts), exec_ms: median(runs) }));
