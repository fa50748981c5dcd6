// The official `e2b` SDK's side of bench/e2b.lua: against the E2B stand-in the Lua side serves
// (E2B_API_URL, E2B_SANDBOX_URL), the time to a first command (Sandbox.create, then
// commands.run('true'); the kill after it is not timed) and of commands.run('true') in one
// sandbox (bench/_sdk_timing.mjs). Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { firstAndExec } from './_sdk_timing.mjs';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { Sandbox } = require('e2b');

const opts = {
  apiKey: process.env.E2B_API_KEY,
  apiUrl: process.env.E2B_API_URL,
  sandboxUrl: process.env.E2B_SANDBOX_URL,
  requestTimeoutMs: 60000,
};

await firstAndExec({
  open: () => Sandbox.create('base', { ...opts, timeoutMs: 600000, allowInternetAccess: false }),
  // commands.run raises when the command fails
  exec: (sbx) => sbx.commands.run('true'),
  close: (sbx) => sbx.kill(),
});
