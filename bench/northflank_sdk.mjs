// The official @northflank/js-client's side of bench/northflank.lua: against the Northflank
// stand-in the Lua side serves (STAND_IN_URL), through the stand-in's WebSocket front
// (spec/npm/northflank_front.mjs, in this process), the median time to a first command (create
// a deployment service, read it until COMPLETED, then execServiceCommand('true'); the delete
// after it is not timed) over N_FIRST runs, and of execServiceCommand('true') on one service
// over N_EXEC runs, each after two untimed ones. Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { ApiClient, ApiClientInMemoryContextProvider } = require('@northflank/js-client');
const { startFront } = await import(pathToFileURL(`${process.cwd()}/spec/npm/northflank_front.mjs`).href);

const front = await startFront(process.env.STAND_IN_URL);
const projectId = process.env.STAND_IN_PROJECT;
const contexts = new ApiClientInMemoryContextProvider();
await contexts.addContext({ name: 'bench', token: process.env.STAND_IN_TOKEN, host: front.url });
const api = new ApiClient(contexts, { throwErrorOnHttpErrorCode: true });

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

let seq = 0;
async function create() {
  seq += 1;
  const created = await api.create.service.deployment({
    parameters: { projectId },
    data: {
      name: `bench-${seq}`, billing: { deploymentPlan: 'nf-compute-20' },
      deployment: { instances: 1, external: { imagePath: 'node:22-bookworm' },
        docker: { configType: 'customCommand', customCommand: 'sleep infinity' } },
    },
  });
  const serviceId = created.data.id;
  for (;;) {
    const got = await api.get.service({ parameters: { projectId, serviceId } });
    if (got.data.status?.deployment?.status === 'COMPLETED') return serviceId;
  }
}

async function exec(serviceId) {
  const r = await api.exec.execServiceCommand({ projectId, serviceId }, { command: ['true'] });
  if (r.commandResult.exitCode !== 0) throw new Error('true failed');
}

const first = await timed(Number(process.env.N_FIRST), async () => {
  const t0 = performance.now();
  const serviceId = await create();
  await exec(serviceId);
  const ms = performance.now() - t0;
  await api.delete.service({ parameters: { projectId, serviceId } });
  return ms;
});
const serviceId = await create();
const execMs = await timed(Number(process.env.N_EXEC), async () => {
  const t0 = performance.now();
  await exec(serviceId);
  return performance.now() - t0;
});
await api.delete.service({ parameters: { projectId, serviceId } });
await front.close();
console.log('RESULT ' + JSON.stringify({ first_ms: first, exec_ms: execMs }));
