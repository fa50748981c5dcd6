// The official @vercel/sandbox SDK, unchanged, against the project's Vercel stand-in
// (spec/support/vercel_service.lua), run by spec/providers/vercel_spec.lua.
//
// The SDK has no base-URL option; its documented `fetch` option (Sandbox.create, get, list)
// takes a fetch function, and this one sends what the SDK addresses to https://vercel.com/api
// to the stand-in instead (STAND_IN_URL). Credentials are the SDK's own options (token,
// teamId, projectId), from STAND_IN_TOKEN, STAND_IN_TEAM and STAND_IN_PROJECT.
//
// Create, a command with its exit code and output, a file written and read back (and one
// that is not there), a command that sees the file, the listing, a detached command killed,
// another waited for and its logs read, a snapshot (which stops the sandbox, as the service
// documents), a sandbox made from it, the snapshot deleted, and the stop. Prints `RESULT {json}`.
import { Sandbox, Snapshot } from '@vercel/sandbox';

const base = process.env.STAND_IN_URL;
const credentials = {
  token: process.env.STAND_IN_TOKEN,
  teamId: process.env.STAND_IN_TEAM,
  projectId: process.env.STAND_IN_PROJECT,
};
const SERVICE = 'https://vercel.com/api';

function standInFetch(input, init) {
  const url = String(input);
  if (!url.startsWith(SERVICE)) throw new Error(`unexpected URL ${url}`);
  return fetch(base + url.slice(SERVICE.length), init);
}

const sandbox = await Sandbox.create({ ...credentials, fetch: standInFetch, timeout: 120000, networkPolicy: 'deny-all' });
const result = {};
try {
  const run = await sandbox.runCommand('sh', ['-c', 'echo out; echo err >&2; exit 3']);
  result.exit_code = run.exitCode;
  result.stdout = await run.stdout();
  result.stderr = await run.stderr();

  await sandbox.writeFiles([{ path: 'sdk/hello.txt', content: Buffer.from('hello from the SDK\n') }]);
  result.file = (await sandbox.readFileToBuffer({ path: 'sdk/hello.txt' }))?.toString();
  result.missing_is_null = (await sandbox.readFileToBuffer({ path: 'sdk/no-such-file' })) === null;
  result.cat = await (await sandbox.runCommand('cat', ['sdk/hello.txt'])).stdout();

  const listed = await Sandbox.list({ ...credentials, fetch: standInFetch });
  result.listed = listed.sandboxes.some((s) => s.name === sandbox.name);

  const sleeper = await sandbox.runCommand({ cmd: 'sleep', args: ['30'], detached: true });
  await sleeper.kill();
  result.killed_exit = (await sleeper.wait()).exitCode;
  // the kill reaches the command's own process: a child it left in the background lives on
  const parent = await sandbox.runCommand({ cmd: 'sh',
    args: ['-c', 'sleep 45 >/dev/null 2>&1 & echo $! > bg.pid; sleep 46'], detached: true });
  for (let i = 0; i < 100; i++) {
    if ((await (await sandbox.runCommand('sh', ['-c', 'cat bg.pid 2>/dev/null || true'])).stdout())) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  await parent.kill('SIGKILL');
  result.parent_exit = (await parent.wait()).exitCode;
  result.child_after_kill = await (await sandbox.runCommand('sh',
    ['-c', 'kill -0 $(cat bg.pid) && echo alive; kill $(cat bg.pid)'])).stdout();

  const later = await sandbox.runCommand({ cmd: 'sh', args: ['-c', 'sleep 0.2; echo later'], detached: true });
  await later.wait();
  result.detached_stdout = await later.stdout();

  await sandbox.writeFiles([{ path: 'snap/kept.txt', content: Buffer.from('kept by the snapshot') }]);
  const snap = await sandbox.snapshot({ expiration: 86400000 });
  result.snapshot = { id: snap.snapshotId, status: snap.status, size: snap.sizeBytes,
    source: snap.sourceSessionId, expires: snap.expiresAt.getTime() - snap.createdAt.getTime() };
  result.session_after_snapshot = sandbox.currentSession().status;
  const fork = await Sandbox.create({ ...credentials, fetch: standInFetch, timeout: 60000, networkPolicy: 'deny-all',
    source: { type: 'snapshot', snapshotId: snap.snapshotId } });
  result.fork_file = (await fork.readFileToBuffer({ path: 'snap/kept.txt' }))?.toString();
  result.fork_source = fork.sourceSnapshotId ?? null;
  await fork.stop();
  const got = await Snapshot.get({ ...credentials, fetch: standInFetch, snapshotId: snap.snapshotId });
  result.got_status = got.status;
  await got.delete();
  result.deleted_status = got.status;
  try {
    await Sandbox.create({ ...credentials, fetch: standInFetch, timeout: 60000,
      source: { type: 'snapshot', snapshotId: snap.snapshotId } });
    result.from_deleted = 'created';
  } catch (e) {
    result.from_deleted = [e.response?.status, e.json?.error?.code];
  }
} finally {
  const stopped = await sandbox.stop();
  result.status = stopped.status;
}
console.log('RESULT ' + JSON.stringify(result));
