// The official Daytona SDK (@daytonaio/sdk, pinned in spec/npm/package.json) against a Daytona
// stand-in (spec/support/daytona_service.lua), unchanged: only its documented options
// (apiKey, apiUrl, target) point it at the stand-in.
//
//   DAYTONA_API_KEY=... node spec/npm/daytona_sdk.js check <apiUrl>
//       create a sandbox (env, labels), run a command (exit code and output), upload and
//       download a file, list the directory and the sandboxes, snapshot the sandbox and start
//       one from the snapshot, delete both; prints one JSON line
//   DAYTONA_API_KEY=... node spec/npm/daytona_sdk.js bench <apiUrl> <n>
//       medians over n runs: create + executeCommand('true') (then delete, not timed), and
//       executeCommand('true') on one sandbox; prints one JSON line { first_ms, exec_ms }
'use strict';

const { Daytona } = require('@daytonaio/sdk');

function client(apiUrl) {
  return new Daytona({ apiKey: process.env.DAYTONA_API_KEY, apiUrl, target: 'us' });
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

async function check(apiUrl) {
  const daytona = client(apiUrl);
  const out = {};
  const sandbox = await daytona.create({
    language: 'python', envVars: { GREETING: 'hi' }, labels: { suite: 'sdk-check' },
  });
  out.id = sandbox.id;
  out.state = sandbox.state;
  const r = await sandbox.process.executeCommand('echo "$GREETING from the sdk"; echo oops >&2; exit 3');
  out.exec = { exitCode: r.exitCode, result: r.result };
  // a timeout kills the command's process group: a setsid'd child lives on, one of the group does not
  try {
    await sandbox.process.executeCommand('setsid sleep 47 >/dev/null 2>&1 & echo $! > s.pid; '
      + 'sleep 48 >/dev/null 2>&1 & echo $! > g.pid; sleep 49', undefined, undefined, 1);
    out.timeout = 'no error';
  } catch (e) {
    out.timeout = e.statusCode || String(e.message).slice(0, 80);
  }
  out.after_timeout = (await sandbox.process.executeCommand('kill -0 $(cat s.pid) && echo s-alive; '
    + 'kill -0 $(cat g.pid) 2>/dev/null && echo g-alive; kill $(cat s.pid)')).result;
  const bytes = Buffer.from([0, 1, 2, 250, 255, 10, 104, 105]);
  await sandbox.fs.uploadFile(bytes, 'sdk/dir/file.bin');
  const back = await sandbox.fs.downloadFile('sdk/dir/file.bin');
  out.file = { same: Buffer.compare(bytes, back) === 0, length: back.length };
  out.listing = (await sandbox.fs.listFiles('sdk/dir')).map((f) => ({ name: f.name, size: f.size, isDir: f.isDir }));
  out.listed = [];
  for await (const s of daytona.list({ labels: { suite: 'sdk-check' } })) out.listed.push(s.id);
  // a snapshot of the running sandbox's files: a new sandbox starts from it; deleted, it is gone
  await sandbox.fs.uploadFile(Buffer.from('kept by the snapshot'), 'snap/kept.txt');
  const name = `sdk-snap-${process.pid}`;
  await sandbox.createSnapshot(name);
  out.state_after_snapshot = sandbox.state;
  const snap = await daytona.snapshot.get(name);
  out.snapshot = { state: snap.state, fromSandbox: snap.sourceSandboxId === sandbox.id, sized: snap.size > 0 };
  out.snapshots_listed = (await daytona.snapshot.list({ sourceSandboxId: sandbox.id })).items.map((x) => x.name);
  const fork = await daytona.create({ snapshot: name });
  out.fork_file = (await fork.fs.downloadFile('snap/kept.txt')).toString();
  await fork.delete();
  await daytona.snapshot.delete(snap);
  try {
    await daytona.snapshot.get(name);
    out.snapshot_after_delete = 'found';
  } catch (e) {
    out.snapshot_after_delete = e.statusCode || String(e.message).slice(0, 80);
  }
  await sandbox.delete();
  try {
    await daytona.get(sandbox.id);
    out.after_delete = 'found';
  } catch (e) {
    out.after_delete = e.statusCode || String(e.message).slice(0, 80);
  }
  return out;
}

async function bench(apiUrl, n) {
  const daytona = client(apiUrl);
  const first = [];
  const exec = [];
  for (let i = 0; i < n + 1; i++) {
    const t0 = performance.now();
    const sandbox = await daytona.create({ language: 'python', labels: { suite: 'sdk-bench' } });
    const r = await sandbox.process.executeCommand('true');
    if (r.exitCode !== 0) throw new Error('true did not exit 0');
    if (i > 0) first.push(performance.now() - t0);   // the first is a warm-up
    await sandbox.delete();
  }
  const sandbox = await daytona.create({ language: 'python', labels: { suite: 'sdk-bench' } });
  for (let i = 0; i < n + 3; i++) {
    const t0 = performance.now();
    const r = await sandbox.process.executeCommand('true');
    if (r.exitCode !== 0) throw new Error('true did not exit 0');
    if (i >= 3) exec.push(performance.now() - t0);
  }
  await sandbox.delete();
  return { first_ms: median(first), exec_ms: median(exec) };
}

async function main() {
  const [mode, apiUrl, n] = process.argv.slice(2);
  const out = mode === 'bench' ? await bench(apiUrl, Number(n) || 10) : await check(apiUrl);
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().then(
  // the SDK's event socket (which the stand-in does not serve) would keep retrying: end here
  () => process.exit(0),
  (e) => {
    process.stderr.write('daytona_sdk: ' + (e && e.stack ? e.stack : String(e)) + '\n');
    process.exit(1);
  },
);
