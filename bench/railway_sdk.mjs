// The official `railway` SDK's side of bench/railway.lua: against the Railway stand-in and its
// exec bridge the Lua side serves (STAND_IN_URL, STAND_IN_WS), the time to a first command
// (Sandbox.create, then exec 'true'; the destroy after it is not timed) and of exec 'true' in one
// sandbox (bench/_sdk_timing.mjs). Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { firstAndExec } from './_sdk_timing.mjs';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { Sandbox } = await import(require.resolve('railway'));
const WebSocket = require('ws');

const options = {
  endpoint: process.env.STAND_IN_URL, tcpProxyWsEndpoint: process.env.STAND_IN_WS, webSocketImpl: WebSocket,
  token: process.env.STAND_IN_TOKEN, environmentId: process.env.STAND_IN_ENV,
};

await firstAndExec({
  open: () => Sandbox.create({ ...options }),
  exec: async (sb) => {
    const r = await sb.exec('true');
    if (r.exitCode !== 0) throw new Error('true failed');
  },
  close: (sb) => sb.destroy(),
});
process.exit(0);
