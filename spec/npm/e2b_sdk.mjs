// The official `e2b` SDK against the E2B stand-in (spec/support/e2b_service.lua), run by
// spec/providers/e2b_spec.lua: create, a command's exit code and output, a file written and read,
// a listing, the sandbox list, a command's timeout and its kill (each reaching the command's own
// process only, as envd's do: a background child lives on), a snapshot (a sandbox made from it,
// its listing, its deletion), kill. Prints one JSON line with what it saw; exits 1 on a failure.
// The stand-in comes from the environment: E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL (the
// SDK's own variables, passed here as options).
import { Sandbox, CommandExitError, TimeoutError } from 'e2b';

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
  // the command's deadline kills bash, not the child it left in the background
  try {
    await sbx.commands.run('sleep 41 >/dev/null 2>&1 & echo $! > bg1.pid; sleep 42', { timeoutMs: 1000 });
    out.timeout = { threw: false };
  } catch (e) {
    out.timeout = { threw: e instanceof TimeoutError };
  }
  out.timeoutChild = (await sbx.commands.run('kill -0 $(cat bg1.pid) && echo alive')).stdout;
  // as does the SDK's kill (SendSignal)
  const h = await sbx.commands.run('sleep 43 >/dev/null 2>&1 & echo $! > bg2.pid; sleep 44', { background: true });
  for (let i = 0; i < 100; i++) {
    if ((await sbx.commands.run('cat bg2.pid 2>/dev/null || true')).stdout) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  out.handleKilled = await h.kill();
  const waited = await h.wait().then(() => 'exited', (e) => (e instanceof CommandExitError ? e.exitCode : String(e)));
  out.killedWait = waited;
  out.killChild = (await sbx.commands.run('kill -0 $(cat bg2.pid) && echo alive')).stdout;
  out.infoTemplate = (await Sandbox.getInfo(sbx.sandboxId, opts)).templateId;
  // a snapshot: a new sandbox starts from it with the files, it is listed, deleted once
  await sbx.files.write('snap/kept.txt', 'kept by the snapshot');
  const snap = await sbx.createSnapshot();
  out.snapshot = { id: snap.snapshotId, names: snap.names };
  await sbx.files.write('snap/kept.txt', 'changed after the snapshot');
  const fork = await Sandbox.create(snap.snapshotId, { ...opts, timeoutMs: 60000 });
  out.forkRead = await fork.files.read('snap/kept.txt');
  out.sourceRead = await sbx.files.read('snap/kept.txt');
  out.snapshotsListed = (await sbx.listSnapshots().nextItems()).map((s) => s.snapshotId);
  await fork.kill();
  out.snapshotDeleted = await Sandbox.deleteSnapshot(snap.snapshotId, opts);
  out.snapshotDeletedAgain = await Sandbox.deleteSnapshot(snap.snapshotId, opts);
  try {
    await Sandbox.create(snap.snapshotId, { ...opts, timeoutMs: 60000 });
    out.fromDeleted = 'created';
  } catch (e) {
    out.fromDeleted = e.name;
  }
  out.killed = await sbx.kill();
  out.killedAgain = await Sandbox.kill(sbx.sandboxId, opts);
  const after = await Sandbox.list({ ...opts, query: { metadata: { run: process.env.RUN_ID ?? 'x' } } }).nextItems();
  out.listedAfter = after.map((s) => s.sandboxId);
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ ...out, error: String(e && e.stack || e) }));
  process.exit(1);
}
