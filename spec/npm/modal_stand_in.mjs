// A stand-in for Modal's gRPC API, for specs: the control-plane service (modal.client.ModalClient)
// and the per-task command service (modal.task_command_router.TaskCommandRouter) on one loopback
// HTTP/2 port without TLS, served by @grpc/grpc-js from the project's own .proto files (proto/modal),
// over real local processes. What mayura.sandbox.modal and the official `modal` SDK talk to.
//
//   node spec/npm/modal_stand_in.mjs     (env STAND_IN_TOKEN_ID, STAND_IN_TOKEN_SECRET, STAND_IN_ROOT,
//                                        STAND_IN_INFO: a file that gets { url, control, cert } once it
//                                        listens; STAND_IN_TLS=1: both services over TLS (HTTP/2 by
//                                        ALPN) with the certificate `cert`, at an https:// url)
//   import { startStandIn } from './modal_stand_in.mjs';   // the same in-process: { url, control, close }
//
// A sandbox is a bubblewrap container of its own (its own pid, IPC and UTS namespaces, and network
// namespace unless the network is open; the host's /usr and /etc read-only, a private /tmp, and a
// writable directory of the stand-in's at the workdir) whose main process, the entrypoint (by
// default `sleep <timeout_secs>`), runs as nobody. A command is entered into its namespaces with
// nsenter, as nobody, with only the environment it was given. The sandbox ends at its timeout, when
// its entrypoint exits, or at SandboxTerminate: the namespace's first process is killed, and every
// process in the sandbox with it. Images are names only: every image runs on the host's /usr.
// A port in `open_ports` is a tunnel: TLS (a self-signed certificate for 127.0.0.1, its file given
// as `cert`) on a loopback port, passed on to the port in the sandbox. A network ALLOWLIST gets no
// network at all (the allowed domains are recorded, not let through: never kinder than Modal).
// TaskSnapshotFilesystem makes an image of the sandbox's files while it runs on: here the files
// of its workdir and /tmp (copied with owners, modes, times and links as links; Modal keeps the
// whole container filesystem, never the memory), kept `ttl_seconds` (at least 1, or -1: no end);
// a sandbox made with that image id starts with them; ImageDelete deletes an image (NOT_FOUND for
// one it does not know or that expired); a create from an image that is gone is NOT_FOUND.
// Not enforced: `resources` (recorded only). Modal's SDK does its file calls as commands of
// /__modal/.bin/modal-sandbox-fs-tools, which here is spec/npm/modal_fs_tools.cjs, mounted read-only.
//
// What a caller must send, as Modal asks: `x-modal-token-id` and `x-modal-token-secret` on every
// control-plane call (else UNAUTHENTICATED), `x-modal-auth-token` when sent must be one this
// stand-in made (AuthTokenGet: a JWT with `exp`), and `authorization: Bearer <jwt>` from
// TaskGetCommandRouterAccess on the command service. A sandbox or command it does not know is
// NOT_FOUND; a command on a sandbox that ended is NOT_FOUND too.
//
// The control port (HTTP/1.1 JSON on loopback) is for specs: POST /faults { method, code, count,
// delay_ms, details } makes the next `count` calls of a method (its last name, or '*') answer that
// gRPC status (code 0 with delay_ms: only the delay); GET /calls lists { method, request, metadata,
// deadline_ms (what was left of the caller's deadline when the call came, or null) };
// GET /sandboxes lists each sandbox's { id, state, result, pid, network, definition }; GET
// /snapshots the image ids of the snapshots it holds; POST /config
// { auth_token_ttl_s } sets the life of the auth tokens AuthTokenGet gives from then on (3600).
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import crypto from 'node:crypto';
import { spawn, execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const PROTO_DIR = fileURLToPath(new URL('../../proto/', import.meta.url));
const FS_TOOLS = fileURLToPath(new URL('./modal_fs_tools.cjs', import.meta.url));
const NOBODY = 65534;
const S = grpc.status;
const STATUS = { SUCCESS: 1, FAILURE: 2, TERMINATED: 3, TIMEOUT: 4 };
const MAX_TIMEOUT_SECS = 24 * 3600;
const DEFAULT_TIMEOUT_SECS = 300;

function rid(prefix) { return `${prefix}-${crypto.randomBytes(10).toString('hex')}`; }
// A sandbox of the first API (SandboxCreate) has an id of 22 letters and digits, which the SDK
// tells from the second's (SandboxCreateV2) to choose the calls it makes about it.
function v1Id() {
  const abc = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
  return `sb-${[...crypto.randomBytes(22)].map((b) => abc[b % abc.length]).join('')}`;
}
function b64url(o) { return Buffer.from(JSON.stringify(o)).toString('base64url'); }
function fail(code, details) { const e = new Error(details); e.code = code; e.details = details; return e; }

export async function startStandIn(opts = {}) {
  const tokenId = opts.tokenId ?? 'ak-standin';
  const tokenSecret = opts.tokenSecret ?? 'as-standin';
  const root = fs.mkdtempSync(path.join(opts.root ?? os.tmpdir(), 'modal-stand-in-'));
  fs.chmodSync(root, 0o711);   // the relays (as nobody) reach their own directory in it
  const def = protoLoader.loadSync(['modal/api.proto', 'modal/task_command_router.proto'], {
    includeDirs: [PROTO_DIR], keepCase: true, longs: Number, enums: Number, defaults: true, oneofs: true,
  });
  const pkg = grpc.loadPackageDefinition(def);
  const apps = new Map();       // name -> id
  const images = new Map();     // id -> tag
  const snapshots = new Map();  // image id -> { dir (work/ and tmp/ in it), expires (ms, or null) }
  const sandboxes = new Map();  // id -> sandbox
  const secrets = new Map();    // id -> { name, env }
  const tasks = new Map();      // task id -> sandbox
  const authTokens = new Map();  // token -> exp (epoch seconds)
  const config = { auth_token_ttl_s: 3600 };
  const calls = [];
  const faults = [];
  let port = 0;
  // the tunnels' certificate: self-signed for 127.0.0.1, made once (its file is `cert` for clients)
  const certFile = path.join(root, 'tunnel-cert.pem');
  const keyFile = path.join(root, 'tunnel-key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', keyFile, '-out', certFile, '-days', '2', '-subj', '/CN=127.0.0.1',
    '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'ignore' });
  const tlsOptions = { key: fs.readFileSync(keyFile), cert: fs.readFileSync(certFile) };

  // A port of a sandbox as Modal serves it: TLS on a loopback port of the host, passed on to the
  // port in the sandbox (through a relay in the sandbox's network namespace when it has its own).
  async function openTunnels(sb) {
    const ports = (sb.definition.open_ports?.ports ?? []).map((p) => p.port);
    if (!ports.length) return;
    let target = (p) => net.connect(p, '127.0.0.1');
    if (!sb.open) {
      const dir = fs.mkdtempSync(path.join(root, 'relay-'));
      const relay = [
        "const net = require('net'); const [dir, ...ports] = process.argv.slice(1);",
        'for (const p of ports) net.createServer((c) => { const u = net.connect(Number(p), "127.0.0.1");',
        "  c.pipe(u).pipe(c); u.on('error', () => c.destroy()); c.on('error', () => u.destroy());",
        '}).listen(`${dir}/p-${p}.sock`);',
      ].join('\n');
      fs.chownSync(dir, NOBODY, NOBODY);
      // as nobody, in the sandbox's network namespace only, and killed with this process
      sb.relay = spawn('setpriv', ['--pdeathsig', 'KILL', '--', 'nsenter', '-t', String(sb.pid), '-n',
        '-S', String(NOBODY), '-G', String(NOBODY), '--', process.execPath, '-e', relay, dir, ...ports.map(String)],
      { stdio: 'ignore' });
      target = (p) => net.connect(path.join(dir, `p-${p}.sock`));
      const want = ports.map((p) => path.join(dir, `p-${p}.sock`));
      for (let i = 0; i < 400 && !want.every((f) => fs.existsSync(f)); i++) await new Promise((r) => setTimeout(r, 5));
    }
    for (const p of ports) {
      const server = tls.createServer(tlsOptions, (c) => {
        const u = target(p);
        c.pipe(u).pipe(c);
        u.on('error', () => c.destroy());
        c.on('error', () => u.destroy());
      });
      await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
      sb.tunnels.push({ host: '127.0.0.1', port: server.address().port, container_port: p, server });
    }
  }
  function tunnelsOf(sb) {
    return sb.tunnels.map((t) => ({ host: t.host, port: t.port, container_port: t.container_port }));
  }

  // {======================================================
  // Sandboxes
  // =======================================================

  function finish(sb, result) {
    if (sb.result) return;
    sb.result = result;
    sb.state = 'ended';
    clearTimeout(sb.timer);
    // the namespace's first process: every process of the sandbox dies with it
    if (sb.info) { try { process.kill(sb.info, 'SIGKILL'); } catch { /* gone already */ } }
    for (const ex of sb.execs.values()) ex.kill('SIGKILL');
    for (const t of sb.tunnels) t.server.close();
    if (sb.relay) sb.relay.kill('SIGKILL');
    for (const w of sb.waiters.splice(0)) w();
    fs.rm(sb.dir, { recursive: true, force: true }, () => {});
  }

  // The snapshot of an image id, or null; one past its ttl is gone (with its image).
  function snapshotOf(imageId) {
    const snap = snapshots.get(imageId);
    if (!snap) return null;
    if (snap.expires !== null && Date.now() >= snap.expires) {
      dropSnapshot(imageId);
      return null;
    }
    return snap;
  }
  function dropSnapshot(imageId) {
    const snap = snapshots.get(imageId);
    snapshots.delete(imageId);
    images.delete(imageId);
    if (snap) fs.rm(snap.dir, { recursive: true, force: true }, () => {});
  }

  function createSandbox(appId, d, tags, secretEnv = {}, v1 = false) {
    if (snapshots.has(d.image_id)) snapshotOf(d.image_id);
    if (!d.image_id || !images.has(d.image_id)) throw fail(S.NOT_FOUND, `Image ${d.image_id} not found`);
    const from = snapshots.get(d.image_id) ?? null;
    if (d.name) {
      if (!/^[A-Za-z0-9._-]{1,64}$/.test(d.name)) throw fail(S.INVALID_ARGUMENT, 'invalid sandbox name');
      for (const other of sandboxes.values()) {
        if (other.appId === appId && other.definition.name === d.name && !other.result) {
          throw fail(S.ALREADY_EXISTS, `A sandbox named ${d.name} is running`);
        }
      }
    }
    const timeout = d.timeout_secs || DEFAULT_TIMEOUT_SECS;
    if (timeout > MAX_TIMEOUT_SECS) throw fail(S.INVALID_ARGUMENT, 'timeout_secs is above 24 hours');
    const workdir = d.workdir || '/';
    if (!path.isAbsolute(workdir) || workdir.split('/').includes('..')) {
      throw fail(S.INVALID_ARGUMENT, 'workdir must be an absolute path');
    }
    const na = d.network_access;
    const open = !d.block_network && (!na || na.network_access_type === 0 || na.network_access_type === 1);
    const id = v1 ? v1Id() : rid('sb');
    const dir = path.join(root, id);
    fs.mkdirSync(dir, { mode: 0o755 });
    fs.chownSync(dir, NOBODY, NOBODY);
    if (from) execFileSync('cp', ['-a', '--', `${path.join(from.dir, 'work')}/.`, dir]);
    const mount = workdir === '/' ? '/workspace' : workdir;
    const args = ['--info-fd', '3', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--die-with-parent'];
    if (!open) args.push('--unshare-net');
    args.push('--ro-bind', '/usr', '/usr', '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/sbin', '/sbin',
      '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64', '--ro-bind', '/etc', '/etc',
      '--perms', '1777', '--tmpfs', '/tmp', '--bind', dir, mount, '--proc', '/proc', '--dev', '/dev',
      '--perms', '0755', '--dir', '/__modal', '--perms', '0755', '--dir', '/__modal/.bin',
      '--ro-bind', FS_TOOLS, '/__modal/.bin/modal-sandbox-fs-tools',
      '--chdir', workdir, 'setpriv', '--reuid', String(NOBODY), '--regid', String(NOBODY), '--clear-groups', '--');
    const entry = d.entrypoint_args.length ? d.entrypoint_args : ['sleep', String(timeout)];
    const baseEnv = { ...(d.environment_variables?.contents ?? {}), ...envOfSecrets(d.secret_ids), ...secretEnv };
    const env = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp', ...baseEnv };
    const child = spawn('bwrap', [...args, ...entry], { stdio: ['ignore', 'ignore', 'ignore', 'pipe'], env });
    const sb = {
      id, appId, taskId: rid('ta'), jwt: null, dir, baseEnv, info: 0, workdir, open, definition: d, tags, state: 'starting',
      result: null, pid: 0, execs: new Map(), waiters: [], ready: null, child, tunnels: [],
    };
    sb.ready = new Promise((resolve) => {
      let info = '';
      child.stdio[3].on('data', (c) => {
        info += c;
        const m = /"child-pid":\s*(\d+)/.exec(info);
        if (m && !sb.info) {
          sb.info = Number(m[1]);
          // bubblewrap says its pid before its mounts are made: the sandbox is ready once the main
          // process (forked after them) is there; commands enter that process's namespaces
          const poll = () => {
            if (sb.result) { resolve(); return; }
            let kids = '';
            try { kids = fs.readFileSync(`/proc/${sb.info}/task/${sb.info}/children`, 'utf8').trim(); } catch { /* not yet */ }
            if (kids) { sb.pid = Number(kids.split(/\s+/)[0]); sb.state = 'running'; resolve(); } else setTimeout(poll, 5);
          };
          poll();
        }
      });
      child.on('exit', () => resolve());
    });
    if (from) {
      // the snapshot's /tmp, into the sandbox's own once it is there
      sb.ready = sb.ready.then(() => {
        if (sb.result || !sb.pid) return;
        try {
          execFileSync('cp', ['-a', '--', `${path.join(from.dir, 'tmp')}/.`, `/proc/${sb.pid}/root/tmp/`]);
        } catch { finish(sb, { status: STATUS.FAILURE, exitcode: 0, exception: 'could not start' }); }
      });
    }
    child.on('exit', (code, signal) => {
      if (signal) finish(sb, { status: STATUS.TERMINATED, exitcode: 0, exception: '' });
      else finish(sb, { status: code === 0 ? STATUS.SUCCESS : STATUS.FAILURE, exitcode: code ?? 0, exception: '' });
    });
    child.on('error', () => finish(sb, { status: STATUS.FAILURE, exitcode: 0, exception: 'could not start' }));
    sb.timer = setTimeout(() => finish(sb, { status: STATUS.TIMEOUT, exitcode: 0, exception: '' }), timeout * 1000);
    sandboxes.set(id, sb);
    tasks.set(sb.taskId, sb);
    return sb;
  }

  function envOfSecrets(ids) {
    const env = {};
    for (const id of ids ?? []) {
      if (!secrets.has(id)) throw fail(S.NOT_FOUND, `Secret ${id} not found`);
      Object.assign(env, secrets.get(id).env);
    }
    return env;
  }
  function envOfSources(sources) {
    const env = {};
    for (const src of sources ?? []) {
      if (src.secret_id) Object.assign(env, envOfSecrets([src.secret_id]));
      else Object.assign(env, src.env?.contents ?? {});
    }
    return env;
  }

  function sandboxOf(id) {
    const sb = sandboxes.get(id);
    if (!sb) throw fail(S.NOT_FOUND, `Sandbox ${id} not found`);
    return sb;
  }

  function waitEnd(sb, ms) {
    if (sb.result || ms <= 0) return Promise.resolve();
    return new Promise((resolve) => {
      const t = setTimeout(done, ms);
      function done() { clearTimeout(t); const i = sb.waiters.indexOf(done); if (i >= 0) sb.waiters.splice(i, 1); resolve(); }
      sb.waiters.push(done);
    });
  }

  // }======================================================

  // {======================================================
  // Commands
  // =======================================================

  function taskOf(taskId) {
    const sb = tasks.get(taskId);
    if (!sb || sb.result) throw fail(S.NOT_FOUND, `Task ${taskId} not found`);
    return sb;
  }

  function execOf(req) {
    const ex = taskOf(req.task_id).execs.get(req.exec_id);
    if (!ex) throw fail(S.NOT_FOUND, `Exec ${req.exec_id} not found`);
    return ex;
  }

  async function startExec(req) {
    const sb = taskOf(req.task_id);
    if (!req.exec_id || sb.execs.has(req.exec_id)) throw fail(S.INVALID_ARGUMENT, 'exec_id missing or in use');
    if (!req.command_args.length) throw fail(S.INVALID_ARGUMENT, 'command_args is empty');
    await sb.ready;
    if (sb.result || !sb.pid) throw fail(S.NOT_FOUND, `Task ${req.task_id} not found`);
    const envArgs = [];
    const given = envOfSources(req.secret_sources);
    for (const [k, v] of Object.entries({ ...given, ...(req.env ?? {}) })) {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw fail(S.INVALID_ARGUMENT, 'bad environment name');
      envArgs.push(`${k}=${v}`);
    }
    const baseEnv = Object.entries(sb.baseEnv).map(([k, v]) => `${k}=${v}`);
    const argv = ['-t', String(sb.pid), '-m', '-p', '-i', '-u', '-n', '-r', '-w', '-S', String(NOBODY), '-G', String(NOBODY),
      '--', '/usr/bin/env', '-i', '-C', req.workdir || sb.workdir, 'PATH=/usr/local/bin:/usr/bin:/bin', 'HOME=/tmp',
      ...baseEnv, ...envArgs, '/bin/sh', '-c', 'exec "$@"', 'sh', ...req.command_args];
    const p = spawn('nsenter', argv, { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
    const ex = {
      id: req.exec_id, proc: p, out: [[], []], size: [0, 0], closed: [false, false], listeners: new Set(),
      stdinAt: 0, exit: null, exitWaiters: [],
      kill(sig) { try { process.kill(-p.pid, sig); } catch { /* ended */ } },
    };
    const stdoutPipe = req.stdout_config === 1;
    const stderrMode = req.stderr_config;  // 0 devnull, 1 pipe, 2 into stdout
    function add(fd, chunk) {
      ex.out[fd].push(chunk);
      ex.size[fd] += chunk.length;
      for (const l of ex.listeners) l();
    }
    p.stdout.on('data', (c) => { if (stdoutPipe) add(0, c); });
    p.stderr.on('data', (c) => { if (stderrMode === 1) add(1, c); else if (stderrMode === 2 && stdoutPipe) add(0, c); });
    let ends = 0;
    const streamEnd = () => { if (++ends === 2) { ex.closed = [true, true]; for (const l of ex.listeners) l(); } };
    p.stdout.on('end', streamEnd);
    p.stderr.on('end', streamEnd);
    p.stdin.on('error', () => {});
    p.on('exit', (code, signal) => {
      // nsenter passes the command's status on: a command killed by a signal is 128 + n from it
      if (signal) ex.exit = { signal: os.constants.signals[signal] ?? 9 };
      else if (code > 128 && ex.killed) ex.exit = { signal: code - 128 };
      else ex.exit = { code };
      clearTimeout(ex.timer);
      for (const w of ex.exitWaiters.splice(0)) w();
    });
    if (req.timeout_secs) {
      ex.timer = setTimeout(() => { ex.killed = true; ex.kill('SIGKILL'); }, req.timeout_secs * 1000);
    }
    sb.execs.set(ex.id, ex);
    return {};
  }

  function writeStdin(req) {
    const ex = execOf(req);
    const data = Buffer.from(req.data ?? []);
    const offset = Number(req.offset);
    if (offset > ex.stdinAt) throw fail(S.INVALID_ARGUMENT, 'stdin offset ahead of what was written');
    const fresh = data.subarray(Math.min(data.length, ex.stdinAt - offset));
    if (fresh.length && !ex.proc.stdin.writableEnded) ex.proc.stdin.write(fresh);
    ex.stdinAt += fresh.length;
    if (req.eof && !ex.proc.stdin.writableEnded) ex.proc.stdin.end();
    return {};
  }

  function readStdio(call) {
    let ex;
    try { ex = execOf(call.request); } catch (e) { call.emit('error', e); return; }
    const fd = call.request.file_descriptor === 1 ? 1 : 0;
    let at = Number(call.request.offset) || 0;
    let idx = 0;
    let pos = 0;   // bytes before out[fd][idx]
    const pump = () => {
      while (idx < ex.out[fd].length) {
        const chunk = ex.out[fd][idx];
        if (at < pos + chunk.length) call.write({ data: chunk.subarray(Math.max(0, at - pos)) });
        at = Math.max(at, pos + chunk.length);
        pos += chunk.length;
        idx++;
      }
      if (ex.closed[fd]) { ex.listeners.delete(pump); call.end(); }
    };
    ex.listeners.add(pump);
    call.on('cancelled', () => ex.listeners.delete(pump));
    pump();
  }

  // A client stream: `start` (task, exec, offset), `data` chunks, then `end` (EOF). The stream is
  // checked once its start names the task.
  function writeStdinStream(call, callback) {
    let ex = null;
    let at = 0;
    let failed = false;
    const refuse = (e) => {
      if (failed) return;
      failed = true;
      callback({ code: e.code ?? S.INTERNAL, details: e.details ?? String(e.message ?? e) });
    };
    const ready = new Promise((resolve) => {
      call.once('data', (m) => {
        if (!m.start) { refuse(fail(S.INVALID_ARGUMENT, 'a stream starts with start')); return; }
        gate('TaskExecStdinWriteStream', call, true, m.start).then(() => {
          ex = execOf(m.start);
          at = Number(m.start.offset) || 0;
          if (at > ex.stdinAt) throw fail(S.INVALID_ARGUMENT, 'stdin offset ahead of what was written');
          resolve();
        }).catch(refuse);
      });
    });
    call.on('data', (m) => {
      if (m.start) return;
      ready.then(() => {
        if (failed || !ex) return;
        if (m.data) {
          const data = Buffer.from(m.data);
          const fresh = data.subarray(Math.min(data.length, ex.stdinAt - at));
          at += data.length;
          if (fresh.length && !ex.proc.stdin.writableEnded) ex.proc.stdin.write(fresh);
          ex.stdinAt += fresh.length;
        } else if (m.end && !ex.proc.stdin.writableEnded) {
          ex.proc.stdin.end();
        }
      });
    });
    call.on('end', () => { ready.then(() => { if (!failed) callback(null, {}); }); });
    call.on('error', () => {});
  }

  async function waitExec(req, poll) {
    const ex = execOf(req);
    if (!ex.exit && !poll) await new Promise((resolve) => ex.exitWaiters.push(resolve));
    return ex.exit ?? {};
  }

  // }======================================================

  // {======================================================
  // gRPC plumbing: auth, faults, the record of calls
  // =======================================================

  function metadataOf(call) {
    const m = {};
    for (const [k, v] of Object.entries(call.metadata.getMap())) m[k] = String(v);
    return m;
  }

  async function gate(name, call, router, request = call.request) {
    const md = metadataOf(call);
    const deadline = call.getDeadline();
    const left = deadline instanceof Date ? deadline.getTime() - Date.now() : Number(deadline) - Date.now();
    calls.push({ method: name, request, metadata: md, deadline_ms: Number.isFinite(left) ? Math.round(left) : null });
    const f = faults.find((x) => x.count > 0 && (x.method === name || x.method === '*'));
    if (f) {
      f.count--;
      if (f.delay_ms) await new Promise((r) => setTimeout(r, f.delay_ms));
      if (f.code) throw fail(f.code, f.details ?? 'fault');
    }
    if (router) {
      const sb = tasks.get(request.task_id);
      if (!sb || !sb.jwt || md.authorization !== `Bearer ${sb.jwt}`) throw fail(S.UNAUTHENTICATED, 'invalid router token');
      return;
    }
    if (md['x-modal-token-id'] !== tokenId || md['x-modal-token-secret'] !== tokenSecret) {
      throw fail(S.UNAUTHENTICATED, `Token ${md['x-modal-token-id']} is not valid`);
    }
    const auth = md['x-modal-auth-token'];
    if (name !== 'AuthTokenGet' && auth !== undefined
        && !(authTokens.has(auth) && authTokens.get(auth) > Date.now() / 1000)) {
      throw fail(S.UNAUTHENTICATED, 'invalid or expired auth token');
    }
  }

  function unary(name, fn, router = false) {
    return (call, callback) => {
      gate(name, call, router).then(() => fn(call.request, call)).then((r) => callback(null, r), (e) => {
        callback({ code: e.code ?? S.INTERNAL, details: e.details ?? String(e.message ?? e) });
      });
    };
  }

  function streaming(name, fn, router = false) {
    return (call) => {
      gate(name, call, router).then(() => fn(call), (e) => {
        call.emit('error', { code: e.code ?? S.INTERNAL, details: e.details ?? String(e.message ?? e) });
      });
    };
  }

  // }======================================================

  const control = {
    AuthTokenGet: unary('AuthTokenGet', () => {
      const now = Math.floor(Date.now() / 1000);
      const exp = now + config.auth_token_ttl_s;
      const token = `${b64url({ alg: 'HS256', typ: 'JWT' })}.${b64url({ sub: tokenId, iat: now, exp })}.${crypto.randomBytes(16).toString('base64url')}`;
      authTokens.set(token, exp);
      return { token };
    }),
    AppGetOrCreate: unary('AppGetOrCreate', (req) => {
      if (!req.app_name) throw fail(S.INVALID_ARGUMENT, 'app_name is empty');
      if (!apps.has(req.app_name)) {
        if (req.object_creation_type !== 1) throw fail(S.NOT_FOUND, `App ${req.app_name} not found`);
        apps.set(req.app_name, rid('ap'));
      }
      return { app_id: apps.get(req.app_name) };
    }),
    EnvironmentGetOrCreate: unary('EnvironmentGetOrCreate', (req) => {
      const name = req.deployment_name || 'main';
      if (name !== 'main') throw fail(S.NOT_FOUND, `Environment ${name} not found`);
      return { environment_id: 'en-main', metadata: { name, settings: { image_builder_version: '2025.06' } } };
    }),
    ImageGetOrCreate: unary('ImageGetOrCreate', (req) => {
      const cmds = req.image?.dockerfile_commands ?? [];
      const m = /^FROM (\S+)$/.exec(cmds[0] ?? '');
      if (!m) throw fail(S.INVALID_ARGUMENT, 'an image starts with FROM');
      let tag = m[1];
      if (tag === 'base') {
        const base = (req.image.base_images ?? []).find((b) => b.docker_tag === 'base');
        if (!base || !images.has(base.image_id)) throw fail(S.NOT_FOUND, 'base image not found');
        tag = images.get(base.image_id);
      }
      const id = `im-${crypto.createHash('sha256').update(cmds.join('\n')).digest('hex').slice(0, 20)}`;
      images.set(id, tag);
      return { image_id: id, result: { status: STATUS.SUCCESS } };
    }),
    ImageDelete: unary('ImageDelete', (req) => {
      if (snapshots.has(req.image_id)) snapshotOf(req.image_id);
      if (!images.has(req.image_id)) throw fail(S.NOT_FOUND, `Image ${req.image_id} not found`);
      if (snapshots.has(req.image_id)) dropSnapshot(req.image_id);
      else images.delete(req.image_id);
      return {};
    }),
    ImageJoinStreaming: streaming('ImageJoinStreaming', (call) => {
      if (!images.has(call.request.image_id)) { call.emit('error', fail(S.NOT_FOUND, 'image not found')); return; }
      call.write({ result: { status: STATUS.SUCCESS }, entry_id: '1', eof: true });
      call.end();
    }),
    SecretGetOrCreate: unary('SecretGetOrCreate', (req) => {
      for (const k of Object.keys(req.env_dict ?? {})) {
        if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw fail(S.INVALID_ARGUMENT, 'bad environment name');
      }
      if (req.deployment_name) {
        for (const [id, sec] of secrets) if (sec.name === req.deployment_name) return { secret_id: id };
        if (req.object_creation_type !== 1) throw fail(S.NOT_FOUND, `Secret ${req.deployment_name} not found`);
      }
      const id = rid('st');
      secrets.set(id, { name: req.deployment_name, env: { ...(req.env_dict ?? {}) } });
      return { secret_id: id };
    }),
    SandboxCreate: unary('SandboxCreate', (req) => {
      if (!req.definition) throw fail(S.INVALID_ARGUMENT, 'definition is missing');
      if (![...apps.values()].includes(req.app_id)) throw fail(S.NOT_FOUND, 'app not found');
      const sb = createSandbox(req.app_id, req.definition, req.tags, {}, true);
      sb.ready.then(() => openTunnels(sb)).then(() => { sb.tunnelsReady = true; });
      return { sandbox_id: sb.id };
    }),
    SandboxCreateV2: unary('SandboxCreateV2', async (req) => {
      if (!req.definition) throw fail(S.INVALID_ARGUMENT, 'definition is missing');
      if (![...apps.values()].includes(req.app_id)) throw fail(S.NOT_FOUND, 'app not found');
      const env = {};
      Object.assign(env, envOfSources(req.secret_sources));
      const sb = createSandbox(req.app_id, req.definition, req.tags, env);
      await sb.ready;
      if (sb.result) throw fail(S.INTERNAL, 'the sandbox did not start');
      await openTunnels(sb);
      return { sandbox_id: sb.id, task_id: sb.taskId, command_router_access: routerAccess(sb), tunnels: tunnelsOf(sb) };
    }),
    SandboxGetCommandRouterAccess: unary('SandboxGetCommandRouterAccess', (req) => {
      const sb = req.target === 'task_id' ? tasks.get(req.task_id) : sandboxes.get(req.sandbox_id);
      if (!sb) throw fail(S.NOT_FOUND, 'Sandbox not found');
      if (sb.result) throw fail(S.FAILED_PRECONDITION, 'sandbox has finished');
      return routerAccess(sb);
    }),
    TaskGetCommandRouterAccess: unary('TaskGetCommandRouterAccess', (req) => {
      const sb = tasks.get(req.task_id);
      if (!sb) throw fail(S.NOT_FOUND, `Task ${req.task_id} not found`);
      if (sb.result) throw fail(S.FAILED_PRECONDITION, 'task has finished');
      return routerAccess(sb);
    }),
  };
  for (const v of ['', 'V2']) {
    control[`SandboxGetFromName${v}`] = unary(`SandboxGetFromName${v}`, (req) => {
      const appId = apps.get(req.app_name);
      for (const sb of sandboxes.values()) {
        if (sb.appId === appId && req.sandbox_name && sb.definition.name === req.sandbox_name && !sb.result) {
          return { sandbox_id: sb.id };
        }
      }
      throw fail(S.NOT_FOUND, `Sandbox ${req.sandbox_name} not found`);
    });
    control[`SandboxGetTaskId${v}`] = unary(`SandboxGetTaskId${v}`, async (req) => {
      const sb = sandboxOf(req.sandbox_id);
      await sb.ready;
      if (sb.result) return { task_result: sb.result };
      return { task_id: sb.taskId };
    });
    control[`SandboxWait${v}`] = unary(`SandboxWait${v}`, async (req) => {
      const sb = sandboxOf(req.sandbox_id);
      await waitEnd(sb, Math.min(55, req.timeout || 0) * 1000);
      return sb.result ? { result: sb.result } : {};
    });
    control[`SandboxTerminate${v}`] = unary(`SandboxTerminate${v}`, (req) => {
      const sb = sandboxOf(req.sandbox_id);
      const existing = sb.result;
      finish(sb, { status: STATUS.TERMINATED, exitcode: 0, exception: '' });
      return existing ? { existing_result: existing } : {};
    });
    control[`SandboxGetTunnels${v}`] = unary(`SandboxGetTunnels${v}`, async (req) => {
      const sb = sandboxOf(req.sandbox_id);
      await sb.ready;
      for (let i = 0; i < 200 && sb.tunnels.length < (sb.definition.open_ports?.ports ?? []).length; i++) {
        await new Promise((r) => setTimeout(r, 10));
      }
      return { tunnels: tunnelsOf(sb) };
    });
  }

  function routerAccess(sb) {
    sb.jwt ??= `${b64url({ alg: 'HS256' })}.${b64url({ task_id: sb.taskId, exp: Math.floor(Date.now() / 1000) + 3600 })}.${crypto.randomBytes(16).toString('base64url')}`;
    return { jwt: sb.jwt, url: `https://127.0.0.1:${port}` };
  }
  async function snapshotFilesystem(req) {
    const sb = taskOf(req.task_id);
    if (!req.snapshot_id) throw fail(S.INVALID_ARGUMENT, 'snapshot_id is missing');
    const ttl = Number(req.ttl_seconds);
    if (!Number.isInteger(ttl) || (ttl < 1 && ttl !== -1)) throw fail(S.INVALID_ARGUMENT, 'ttl_seconds is not valid');
    if (req.container_id) throw fail(S.NOT_FOUND, `Container ${req.container_id} not found`);
    await sb.ready;
    if (sb.result || !sb.pid) throw fail(S.NOT_FOUND, `Task ${req.task_id} not found`);
    const id = `im-${crypto.randomBytes(10).toString('hex')}`;
    const dir = path.join(root, 'snapshots', id);
    fs.mkdirSync(path.join(dir, 'work'), { recursive: true });
    fs.mkdirSync(path.join(dir, 'tmp'));
    try {
      execFileSync('cp', ['-a', '--', `${sb.dir}/.`, path.join(dir, 'work')]);
      execFileSync('cp', ['-a', '--', `/proc/${sb.pid}/root/tmp/.`, path.join(dir, 'tmp')]);
    } catch {
      fs.rmSync(dir, { recursive: true, force: true });
      throw fail(S.INTERNAL, 'the snapshot failed');
    }
    images.set(id, images.get(sb.definition.image_id) ?? 'snapshot');
    snapshots.set(id, { dir, expires: ttl === -1 ? null : Date.now() + ttl * 1000 });
    return { image_id: id };
  }

  const router = {
    TaskSnapshotFilesystem: unary('TaskSnapshotFilesystem', snapshotFilesystem, true),
    TaskExecStart: unary('TaskExecStart', startExec, true),
    TaskExecStdinWrite: unary('TaskExecStdinWrite', writeStdin, true),
    TaskExecStdinWriteStream: writeStdinStream,
    TaskExecStdinStatus: unary('TaskExecStdinStatus', (req) => {
      const ex = execOf(req);
      return { num_bytes_written: ex.stdinAt, closed: ex.proc.stdin.writableEnded };
    }, true),
    TaskExecStdioRead: streaming('TaskExecStdioRead', readStdio, true),
    TaskExecWait: unary('TaskExecWait', (req) => waitExec(req, false), true),
    TaskExecPoll: unary('TaskExecPoll', (req) => waitExec(req, true), true),
  };

  const server = new grpc.Server();
  server.addService(pkg.modal.client.ModalClient.service, control);
  server.addService(pkg.modal.task_command_router.TaskCommandRouter.service, router);
  port = await new Promise((resolve, reject) => {
    const creds = opts.tls
      ? grpc.ServerCredentials.createSsl(null, [{ private_key: tlsOptions.key, cert_chain: tlsOptions.cert }], false)
      : grpc.ServerCredentials.createInsecure();
    server.bindAsync('127.0.0.1:0', creds, (err, p) => (err ? reject(err) : resolve(p)));
  });

  const ctl = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      const send = (v) => { res.writeHead(200, { 'content-type': 'application/json' }); res.end(JSON.stringify(v)); };
      if (req.method === 'POST' && req.url === '/config') {
        Object.assign(config, JSON.parse(body));
        send(config);
      } else if (req.method === 'POST' && req.url === '/faults') {
        const f = JSON.parse(body);
        faults.push({ count: 1, ...f });
        send({ ok: true });
      } else if (req.url === '/calls') {
        send(calls);
      } else if (req.url === '/snapshots') {
        send([...snapshots.keys()].filter((id) => snapshotOf(id)));
      } else if (req.url === '/sandboxes') {
        send([...sandboxes.values()].map((sb) => ({ id: sb.id, state: sb.state, result: sb.result, pid: sb.pid,
          open: sb.open, definition: sb.definition, tags: sb.tags, execs: sb.execs.size })));
      } else {
        res.writeHead(404); res.end();
      }
    });
  });
  await new Promise((resolve) => ctl.listen(0, '127.0.0.1', resolve));

  return {
    url: `${opts.tls ? 'https' : 'http'}://127.0.0.1:${port}`,
    control: `http://127.0.0.1:${ctl.address().port}`,
    cert: certFile,
    sandboxes,
    close: async () => {
      for (const sb of sandboxes.values()) finish(sb, { status: STATUS.TERMINATED, exitcode: 0, exception: '' });
      server.forceShutdown();
      ctl.close();
      ctl.closeAllConnections();
      fs.rmSync(root, { recursive: true, force: true });
    },
  };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === path.resolve(process.argv[1])) {
  const s = await startStandIn({
    tokenId: process.env.STAND_IN_TOKEN_ID, tokenSecret: process.env.STAND_IN_TOKEN_SECRET,
    root: process.env.STAND_IN_ROOT, tls: process.env.STAND_IN_TLS === '1',
  });
  const info = JSON.stringify({ url: s.url, control: s.control, cert: s.cert });
  if (process.env.STAND_IN_INFO) {
    fs.writeFileSync(`${process.env.STAND_IN_INFO}.tmp`, info);
    fs.renameSync(`${process.env.STAND_IN_INFO}.tmp`, process.env.STAND_IN_INFO);
  } else {
    console.log(info);
  }
  const stop = () => { s.close().finally(() => process.exit(0)); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
