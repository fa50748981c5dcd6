// The official @northflank/js-client's side of bench/northflank.lua: against the Northflank
// stand-in the Lua side serves (STAND_IN_URL), through the stand-in's WebSocket front
// (spec/npm/northflank_front.mjs, in this process), the median time to a first command (create
// a deployment service, read it until COMPLETED, then execServiceCommand('true'); the delete
// after it is not timed) and of execServiceCommand('true') on one service (bench/_sdk_timing.mjs).
// Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { firstAndExec } from './_sdk_timing.mjs';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { ApiClient, ApiClientInMemoryContextProvider } = require('@northflank/js-client');
const { startFront } = await import(pathToFileURL(`${process.cwd()}/spec/npm/northflank_front.mjs`).href);

const front = await startFront(process.env.STAND_IN_URL);
const projectId = process.env.STAND_IN_PROJECT;
const contexts = new ApiClientInMemoryContextProvider();
await contexts.addContext({ name: 'bench', token: process.env.STAND_IN_TOKEN, host: front.url });
const api = new ApiClient(contexts, { throwErrorOnHttpErrorCode: true });

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

await firstAndExec({
  open: create,
  exec: async (serviceId) => {
    const r = await api.exec.execServiceCommand({ projectId, serviceId }, { command: ['true'] });
    if (r.commandResult.exitCode !== 0) throw new Error('true failed');
  },
  close: (serviceId) => api.delete.service({ parameters: { projectId, serviceId } }),
});
await front.close();
