// The official @codesandbox/sdk's side of bench/codesandbox.lua: against the CodeSandbox
// stand-in the Lua side serves (STAND_IN_URL, its pitcher front started by the Lua side), the time
// to a first command (sandboxes.create, connect, commands.run('true'); the delete after it is not
// timed) and of commands.run('true') in one sandbox (bench/_sdk_timing.mjs). Prints
// `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { firstAndExec } from './_sdk_timing.mjs';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { CodeSandbox } = require('@codesandbox/sdk');

const sdk = new CodeSandbox(process.env.CSB_TOKEN, { baseUrl: process.env.STAND_IN_URL });

await firstAndExec({
  open: async () => {
    const sandbox = await sdk.sandboxes.create({ hibernationTimeoutSeconds: 600 });
    return { sandbox, client: await sandbox.connect() };
  },
  exec: async (s) => {
    // commands.run raises when the command fails
    await s.client.commands.run('true');
  },
  close: async ({ sandbox, client }) => {
    client.dispose();
    await sdk.sandboxes.delete(sandbox.id);
  },
});
process.exit(0);
