// The official @vercel/sandbox SDK's side of bench/vercel.lua: against the Vercel stand-in the
// Lua side serves (STAND_IN_URL), the time to a first command (Sandbox.create, then
// runCommand('true'); the stop and delete after it are not timed) and of runCommand('true') in one
// sandbox (bench/_sdk_timing.mjs). Prints `RESULT {"first_ms":..,"exec_ms":..}`. The SDK is the
// one the specs install (spec/npm).
import { createRequire } from 'node:module';
import { firstAndExec } from './_sdk_timing.mjs';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { Sandbox } = require('@vercel/sandbox');

const SERVICE = 'https://vercel.com/api';
const base = process.env.STAND_IN_URL;
const options = {
  token: process.env.STAND_IN_TOKEN, teamId: process.env.STAND_IN_TEAM, projectId: process.env.STAND_IN_PROJECT,
  fetch: (input, init) => fetch(base + String(input).slice(SERVICE.length), init),
  timeout: 600000, networkPolicy: 'deny-all',
};

await firstAndExec({
  open: () => Sandbox.create(options),
  exec: async (sandbox) => {
    const r = await sandbox.runCommand('true');
    if (r.exitCode !== 0) throw new Error('true failed');
  },
  close: async (sandbox) => {
    await sandbox.stop();
    await sandbox.delete();
  },
});
