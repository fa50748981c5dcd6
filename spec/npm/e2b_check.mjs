// The official `e2b` SDK against the E2B stand-in (spec/support/e2b_service.lua), run by
// spec/providers/e2b_spec.lua: create, a command's exit code and output, a file written and read,
// a listing, the sandbox list, kill. Prints one JSON line with what it saw; exits 1 on a failure.
// The stand-in comes from the environment: E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL (the
// SDK's own variables, passed here as options).
import { Sandbox, CommandExitError } from 'e2b';

const opts = {
  apiKey: process.env.E2B_API_KEY,
  apiUrl: process.env.E2B_API_URL,
  sandboxUrl: process.env.E2B_SANDBOX_URL,
  requestTimeoutMs: 30000,
};

const out = {};
try {
  const sbx = await Sandbox.create('base', {
    ...opts, timeoutMs: 120000, metadata: { suite: 'sdk', run: process.env.RUN_ID ?? 'x' },
    envs: { GREETING: 'hello from the sdk' }, allowInternetAccess: false,
  });
  out.id = sbx.sandboxId;
  const ok = await sbx.commands.run('echo "$GREETING"; echo oops >&2');
  out.ok = { exitCode: ok.exitCode, stdout: ok.stdout, stderr: ok.stderr };
  try {
    await sbx.commands.run('echo partial; exit 3');
    out.failed = { threw: false };
  } catch (e) {
    out.failed = { threw: e instanceof CommandExitError, exitCode: e.exitCode, stdout: e.stdout };
  }
  const info = await sbx.files.write('sdk/dir/note.txt', 'written by the sdk\n');
  out.written = { path: info.path, name: info.name };
  out.read = await sbx.files.read('sdk/dir/note.txt');
  const bytes = new Uint8Array(256);
  for (let i = 0; i < 256; i++) bytes[i] = i;
  await sbx.files.write('sdk/bytes.bin', bytes.buffer);
  const back = await sbx.files.read('sdk/bytes.bin', { format: 'bytes' });
  out.bytes = back.length === 256 && back.every((b, i) => b === i);
  out.catSeen = (await sbx.commands.run('cat sdk/dir/note.txt')).stdout;
  out.list = (await sbx.files.list('sdk')).map((e) => ({ name: e.name, type: e.type, size: e.size }))
    .sort((a, b) => a.name.localeCompare(b.name));
  const listed = await Sandbox.list({ ...opts, query: { metadata: { suite: 'sdk', run: process.env.RUN_ID ?? 'x' } } })
    .nextItems();
  out.listed = listed.map((s) => s.sandboxId);
  out.infoTemplate = (await Sandbox.getInfo(sbx.sandboxId, opts)).templateId;
  out.killed = await sbx.kill();
  out.killedAgain = await Sandbox.kill(sbx.sandboxId, opts);
  const after = await Sandbox.list({ ...opts, query: { metadata: { run: process.env.RUN_ID ?? 'x' } } }).nextItems();
  out.listedAfter = after.map((s) => s.sandboxId);
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ ...out, error: String(e && e.stack || e) }));
  process.exit(1);
}
