// The official `modal` SDK (0.11.1), unchanged, against the project's Modal stand-in
// (spec/npm/modal_stand_in.mjs), run by spec/providers/modal_spec.lua.
//
// The SDK takes its server from MODAL_SERVER_URL (a plain http:// loopback address: gRPC over
// h2c) and its credentials from MODAL_TOKEN_ID and MODAL_TOKEN_SECRET; STAND_IN_CONTROL is the
// stand-in's control port. It looks an app up by name (made if missing), builds a registry image,
// creates a sandbox with a timeout, workdir, a blocked network and a port, runs commands with env,
// standard input and both outputs streamed, waits for them, fetches a page through the port's
// tunnel (TLS: the stand-in's certificate comes in NODE_EXTRA_CA_CERTS), terminates the sandbox and
// waits for it, reads, writes, lists, makes and removes files with its filesystem API, snapshots
// the files as an image that a new sandbox starts from and deletes it, and tries a wrong token.
// Prints `RESULT {json}`.
import { ModalClient } from 'modal';

const result = {};
const modal = new ModalClient();

// With MAYURA_SANDBOX_ID: only the sandbox mayura made, reached by its id as a user of the SDK
// would: read the file mayura wrote (MAYURA_FILE), write one beside it for mayura to read.
if (process.env.MAYURA_SANDBOX_ID) {
  try {
    const shared = await modal.sandboxes.fromId(process.env.MAYURA_SANDBOX_ID);
    const p = await shared.exec(['cat', process.env.MAYURA_FILE]);
    result.read = await p.stdout.readText();
    result.read_exit = await p.wait();
    await shared.filesystem.writeText('from the SDK\n', `${process.env.MAYURA_FILE}.sdk`);
  } catch (e) {
    result.error = String(e?.stack ?? e);
  }
  console.log(`RESULT ${JSON.stringify(result)}`);
  process.exit(0);
}

let sb;
try {
  const app = await modal.apps.fromName('mayura-sdk-check', { createIfMissing: true });
  result.app_id = app.appId;
  const image = modal.images.fromRegistry('alpine:3.21');
  sb = await modal.sandboxes.create(app, image, {
    timeoutMs: 120000, workdir: '/work', command: ['sleep', '100'], encryptedPorts: [8000], blockNetwork: true,
    env: { AT_CREATE: 'made with it' },
  });
  const envp = await sb.exec(['sh', '-c', 'echo "$AT_CREATE"']);
  result.create_env = await envp.stdout.readText();
  result.sandbox_id = sb.sandboxId;

  const p = await sb.exec(['sh', '-c', 'read a; echo "out $a $PWD"; echo err >&2; exit 3'], {
    stdout: 'pipe', stderr: 'pipe', env: { X: 'y' },
  });
  await p.stdin.writeText('hi\n');
  await p.stdin.close();
  const [out, err, code] = await Promise.all([p.stdout.readText(), p.stderr.readText(), p.wait()]);
  result.stdout = out;
  result.stderr = err;
  result.exit_code = code;

  const e = await sb.exec(['sh', '-c', 'echo "$X"; printf "%s|" "$@"', 'sh', 'a b', 'c'], { env: { X: 'from env' } });
  result.argv_stdout = await e.stdout.readText();
  result.argv_exit = await e.wait();

  const files = await sb.exec(['sh', '-c', 'echo data > f.txt && cat /work/f.txt && id -u']);
  result.file = await files.stdout.readText();

  // a port as its tunnel: a server in the sandbox (no network of its own) reached over TLS
  await sb.exec(['sh', '-c', 'echo tunnel-ok > page.txt && exec busybox httpd -f -p 127.0.0.1:8000 -h /work']);
  const tunnels = await sb.tunnels();
  result.tunnel_url = tunnels[8000]?.url;
  for (let i = 0; i < 50 && !result.tunnel_page; i++) {
    try { result.tunnel_page = await (await fetch(`${tunnels[8000].url}/page.txt`)).text(); } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  // files, as the SDK does them (commands of the sandbox's fs tool, standard input streamed)
  const fsys = sb.filesystem;
  await fsys.writeText('hello files\n', '/work/sub/a.txt');
  await fsys.writeBytes(new Uint8Array([0, 1, 2, 255]), '/work/sub/b.bin');
  result.fs_text = await fsys.readText('/work/sub/a.txt');
  result.fs_bytes = Array.from(await fsys.readBytes('/work/sub/b.bin'));
  result.fs_list = (await fsys.listFiles('/work/sub')).map((e) => `${e.name}:${e.type}:${e.size}`);
  await fsys.makeDirectory('/work/made/deep');
  result.fs_stat = (await fsys.stat('/work/made')).type;
  await fsys.remove('/work/sub/a.txt');
  result.fs_missing = await fsys.readText('/work/sub/a.txt').then(() => 'found', (x) => x.constructor.name);
  result.fs_not_empty = await fsys.remove('/work/made').then(() => 'removed', (x) => x.constructor.name);
  await fsys.remove('/work/made', { recursive: true });
  result.fs_after = (await fsys.listFiles('/work')).map((e) => e.name).sort();

  // a snapshot of the files as an image, a sandbox made from it, the image deleted
  await fsys.writeText('kept by the snapshot\n', '/work/snap/kept.txt');
  await (await sb.exec(['sh', '-c', 'printf t > /tmp/t.txt'])).wait();
  const snapImage = await sb.snapshotFilesystem();
  result.snapshot_image = snapImage.imageId;
  await fsys.writeText('changed after it\n', '/work/snap/kept.txt');
  const fork = await modal.sandboxes.create(app, snapImage, { timeoutMs: 60000, workdir: '/work', blockNetwork: true });
  result.fork_file = await fork.filesystem.readText('/work/snap/kept.txt');
  result.fork_tmp = await (await fork.exec(['cat', '/tmp/t.txt'])).stdout.readText();
  result.source_file = await fsys.readText('/work/snap/kept.txt');
  await fork.terminate();
  await modal.images.delete(snapImage.imageId);
  result.deleted_again = await modal.images.delete(snapImage.imageId).then(() => 'deleted', (x) => x.constructor.name);
  result.from_deleted = await modal.sandboxes.create(app, snapImage, { timeoutMs: 60000 })
    .then(async (s) => { await s.terminate(); return 'created'; }, (x) => x.constructor.name);

  const slow = await sb.exec(['sleep', '30'], { timeoutMs: 1000 });
  const t0 = Date.now();
  result.timeout_exit = await slow.wait().catch((x) => `error: ${x.message}`);
  result.timeout_took_ms = Date.now() - t0;

  await sb.terminate();
  result.terminated_exit = await sb.wait();
  result.exec_after_terminate = await sb.exec(['true']).then(() => 'ran', (x) => x.constructor.name);
} catch (e) {
  result.error = String(e?.stack ?? e);
} finally {
  if (sb) await sb.terminate().catch(() => {});
}

try {
  const wrong = new ModalClient({ tokenId: 'ak-wrong', tokenSecret: 'as-wrong' });
  await wrong.apps.fromName('mayura-sdk-check', { createIfMissing: true });
  result.wrong_token = 'accepted';
} catch (e) {
  result.wrong_token = `${e.constructor.name} ${e.code ?? ''}`.trim();
}
modal.close?.();
console.log(`RESULT ${JSON.stringify(result)}`);
process.exit(0);
