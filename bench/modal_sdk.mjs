// The official `modal` SDK's side of bench/modal.lua: against the Modal stand-in the Lua side runs
// (MODAL_SERVER_URL), the median time to a first command (sandboxes.create, then exec 'true' and
// its wait; the terminate after it is not timed) over N_FIRST runs, and of exec 'true' with its
// wait in one sandbox over N_EXEC runs, each after two untimed ones.
// Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { ModalClient } = await import(pathToFileURL(require.resolve('modal')).href);

const modal = new ModalClient();
const app = await modal.apps.fromName('mayura-bench', { createIfMissing: true });
const image = modal.images.fromRegistry('debian:bookworm-slim');

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
  const p = await sb.exec(['true']);
  if ((await p.wait()) !== 0) throw new Error('true failed');
}

const first = await timed(Number(process.env.N_FIRST), async () => {
  const t0 = performance.now();
  const sb = await modal.sandboxes.create(app, image, { timeoutMs: 600000, blockNetwork: true, workdir: '/workspace' });
  await exec(sb);
  const ms = performance.now() - t0;
  await sb.terminate();
  return ms;
});
const sb = await modal.sandboxes.create(app, image, { timeoutMs: 600000, blockNetwork: true, workdir: '/workspace' });
const execMs = await timed(Number(process.env.N_EXEC), async () => {
  const t0 = performance.now();
  await exec(sb);
  return performance.now() - t0;
});
await sb.terminate();
console.log(`RESULT ${JSON.stringify({ first_ms: first, exec_ms: execMs })}`);
process.exit(0);
