// Shared by the official clients' sides of the hosted benchmarks (bench/*_sdk.mjs): the time to a
// first command and an exec round trip, as the Lua side measures mayura's, printed for it to read.
import { performance } from 'node:perf_hooks';

export function median(xs) {
  xs.sort((a, b) => a - b);
  const n = xs.length;
  return n % 2 ? xs[(n - 1) / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

// The median of `n` runs of `fn` (each returns its own time, ms), after two untimed ones.
export async function timed(n, fn) {
  for (let i = 0; i < 2; i++) await fn();
  const xs = [];
  for (let i = 0; i < n; i++) xs.push(await fn());
  return median(xs);
}

// With the client's own calls (`open()` a sandbox, `exec(s)` 'true' in it and fail unless it exits 0,
// `close(s)`): the median time to a first command (open, then exec; the close after it is not timed)
// over N_FIRST runs, and of exec in one sandbox over N_EXEC runs, each after two untimed ones.
// Prints `RESULT {"first_ms":..,"exec_ms":..}`.
export async function firstAndExec({ open, exec, close }) {
  const first = await timed(Number(process.env.N_FIRST), async () => {
    const t0 = performance.now();
    const s = await open();
    await exec(s);
    const ms = performance.now() - t0;
    await close(s);
    return ms;
  });
  const s = await open();
  const execMs = await timed(Number(process.env.N_EXEC), async () => {
    const t0 = performance.now();
    await exec(s);
    return performance.now() - t0;
  });
  await close(s);
  console.log('RESULT ' + JSON.stringify({ first_ms: first, exec_ms: execMs }));
}
