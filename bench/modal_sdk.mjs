// The official `modal` SDK's side of bench/modal.lua: against the Modal stand-in the Lua side runs
// (MODAL_SERVER_URL), the time to a first command (sandboxes.create, then exec 'true' and its
// wait; the terminate after it is not timed) and of exec 'true' with its wait in one sandbox
// (bench/_sdk_timing.mjs). Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { firstAndExec } from './_sdk_timing.mjs';

const require = createRequire(`${process.cwd()}/spec/npm/package.json`);
const { ModalClient } = await import(pathToFileURL(require.resolve('modal')).href);

const modal = new ModalClient();
const app = await modal.apps.fromName('mayura-bench', { createIfMissing: true });
const image = modal.images.fromRegistry('debian:bookworm-slim');

await firstAndExec({
  open: () => modal.sandboxes.create(app, image, { timeoutMs: 600000, blockNetwork: true, workdir: '/workspace' }),
  exec: async (sb) => {
    const p = await sb.exec(['true']);
    if ((await p.wait()) !== 0) throw new Error('true failed');
  },
  close: (sb) => sb.terminate(),
});
process.exit(0);
