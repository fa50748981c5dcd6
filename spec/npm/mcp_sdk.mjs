// The official MCP TypeScript client against `mayura serve`, over stdio or Streamable HTTP.
//
//   node spec/npm/mcp_sdk.mjs stdio|http MAYURA POLICY LOGFILE
//
// Runs the scenarios below and prints one JSON object: { name: { ok, ...facts } }; the Lua spec
// (spec/mcp/sdk_spec.lua) asserts on it. Each scenario catches its own failure, so one broken
// thing shows as itself. For HTTP the server is started here on a free loopback port with a token
// from a file, and stopped at the end.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync, readdirSync, mkdtempSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [kind, mayura, policy, logFile] = process.argv.slice(2);
const out = {};
const token = randomBytes(24).toString('hex');
let serverProc = null;
let url = null;

async function startHttp() {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-'));
  const tokenFile = join(dir, 'token');
  writeFileSync(tokenFile, token + '\n', { mode: 0o600 });
  serverProc = spawn(mayura, ['serve', '--policy', policy, '--http', '127.0.0.1:0', '--token-file', tokenFile,
    '--log', logFile, '--progress-ms', '100'], { stdio: ['ignore', 'ignore', 'pipe'] });
  url = await new Promise((resolve, reject) => {
    let buf = '';
    serverProc.stderr.on('data', (d) => {
      buf += d;
      const m = buf.match(/listening on (\S+)/);
      if (m) resolve(m[1]);
    });
    serverProc.on('exit', (code) => reject(new Error('server exited ' + code + ': ' + buf)));
  });
}

async function connect(name = 'spec') {
  const client = new Client({ name, version: '1.0.0' });
  let transport;
  if (kind === 'stdio') {
    transport = new StdioClientTransport({ command: mayura, args: ['serve', '--policy', policy, '--log', logFile, '--progress-ms', '100'],
      stderr: 'ignore' });
  } else {
    transport = new StreamableHTTPClientTransport(new URL(url), {
      requestInit: { headers: { Authorization: 'Bearer ' + token } } });
  }
  await client.connect(transport);
  return { client, transport };
}

async function disconnect(c) {
  if (kind === 'http') await c.transport.terminateSession();
  await c.client.close();
}

function text(r) { return (r.content || []).map((x) => x.text).join(''); }

async function scenario(name, fn) {
  try {
    out[name] = { ok: true, ...(await fn()) };
  } catch (e) {
    out[name] = { ok: false, error: String(e && e.stack || e) };
  }
}

// Host processes whose command line holds `marker`.
function hostProcesses(marker) {
  let n = 0;
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      if (readFileSync(`/proc/${p}/cmdline`, 'latin1').replace(/\0/g, ' ').includes(marker)) n++;
    } catch { /* gone */ }
  }
  return n;
}

async function poll(fn, tries = 100, ms = 50) {
  for (let i = 0; i < tries; i++) {
    const v = fn();
    if (v) return true;
    await new Promise((r) => setTimeout(r, ms));
  }
  return false;
}

const exec = (c, command, extra = {}, opts) =>
  c.client.callTool({ name: 'workspace.exec', arguments: { command, ...extra } }, undefined, opts);

async function main() {
  if (kind === 'http') await startHttp();
  const a = await connect('a');

  await scenario('initialize', async () => ({
    server: a.client.getServerVersion().name,
    protocol: kind === 'http' ? a.transport.protocolVersion : undefined,
    capabilities: Object.keys(a.client.getServerCapabilities() || {}),
  }));

  await scenario('list', async () => {
    const { tools } = await a.client.listTools();
    const exec = tools.find((t) => t.name === 'workspace.exec');
    return { names: tools.map((t) => t.name).sort(), exec_required: exec.inputSchema.required,
      exec_type: exec.inputSchema.type, has_description: typeof exec.description === 'string' };
  });

  await scenario('write_read_exec', async () => {
    const w = await a.client.callTool({ name: 'workspace.write', arguments: { path: 'notes/hello.txt', text: 'hello from a' } });
    const r = await a.client.callTool({ name: 'workspace.read', arguments: { path: 'notes/hello.txt' } });
    const e = await exec(a, 'cat notes/hello.txt; echo; id -u');
    return { write_error: w.isError, read_text: r.structuredContent.text, exec_stdout: e.structuredContent.stdout,
      exec_code: e.structuredContent.exit_code, exec_error: e.isError, content_text: JSON.parse(text(e)).stdout };
  });

  await scenario('denied', async () => {
    const r = await a.client.callTool({ name: 'workspace.remove', arguments: { path: 'notes/hello.txt' } });
    const still = await a.client.callTool({ name: 'workspace.read', arguments: { path: 'notes/hello.txt' } });
    return { is_error: r.isError, text: text(r), file_kept: still.structuredContent && still.structuredContent.text };
  });

  await scenario('bad_arguments', async () => {
    const r = await exec(a, '', {});
    return { is_error: r.isError, text: text(r) };
  });

  await scenario('unknown_tool', async () => {
    try {
      await a.client.callTool({ name: 'nope.exec', arguments: {} });
      return { raised: false };
    } catch (e) { return { raised: true, code: e.code }; }
  });

  await scenario('command_timeout', async () => {
    const r = await exec(a, 'sleep 20', { timeout_ms: 300 });
    return { is_error: r.isError, timed_out: r.structuredContent.timed_out };
  });

  await scenario('request_timeout', async () => {
    const marker = 'sleep 41.' + randomBytes(3).readUIntBE(0, 3);
    let code = null;
    try {
      await exec(a, marker, {}, { timeout: 400 });
    } catch (e) { code = e.code; }
    const gone = await poll(() => hostProcesses(marker) === 0);
    return { code, stopped: gone };
  });

  await scenario('progress_and_cancel', async () => {
    const marker = 'sleep 42.' + randomBytes(3).readUIntBE(0, 3);
    const ac = new AbortController();
    const progress = [];
    let started = false;
    const p = exec(a, `echo ready-$((40 + 2)); ${marker} & sleep 43; wait`, {}, {
      signal: ac.signal,
      onprogress: (pr) => { progress.push(pr); },
    }).then(() => 'answered', (e) => 'rejected: ' + e.name);
    const sawOutput = () => progress.some((pr) => typeof pr.message === 'string' && pr.message.includes('ready-42'));
    started = await poll(() => progress.length >= 2 && sawOutput() && hostProcesses(marker) > 0);
    ac.abort('stop');
    const outcome = await p;
    const stopped = await poll(() => hostProcesses(marker) === 0);
    const after = await exec(a, 'echo still here');
    const rising = progress.every((pr, i) => i === 0 || pr.progress > progress[i - 1].progress);
    return { started, progress: progress.length, first_progress: progress[0] && progress[0].progress, outcome,
      stopped, session_still_works: after.structuredContent.stdout, output_seen: sawOutput(), rising };
  });

  await scenario('isolation', async () => {
    const b = await connect('b');
    await b.client.callTool({ name: 'workspace.write', arguments: { path: 'secret.txt', text: 'b only' } });
    const r = await a.client.callTool({ name: 'workspace.read', arguments: { path: 'secret.txt' } });
    const ls = await exec(a, 'ls /workspace; cat /workspace/secret.txt 2>&1; true');
    const rb = await b.client.callTool({ name: 'workspace.read', arguments: { path: 'notes/hello.txt' } });
    await disconnect(b);
    return { a_reads_b: r.isError, a_text: text(r), a_ls: ls.structuredContent.stdout, b_reads_a: rb.isError };
  });

  await scenario('disconnect_releases', async () => {
    const c = await connect('c');
    const marker = 'sleep 44.' + randomBytes(3).readUIntBE(0, 3);
    await exec(c, `setsid ${marker} > /dev/null 2>&1 < /dev/null & echo ok`);
    const running = await poll(() => hostProcesses(marker) > 0);
    await disconnect(c);
    const released = await poll(() => hostProcesses(marker) === 0);
    return { running, released };
  });

  await disconnect(a);
  if (serverProc) {
    serverProc.kill('SIGTERM');
    await new Promise((r) => serverProc.once('exit', r));
  }
  const log = readFileSync(logFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  out.log = {
    ok: true,
    events: [...new Set(log.map((r) => r.event))].sort(),
    denied: log.filter((r) => r.event === 'tool_call' && r.decision === 'denied').length,
    closed_released: log.filter((r) => r.event === 'session_closed' && r.released).length,
    token_leaked: readFileSync(logFile, 'utf8').includes(token),
  };
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().then(() => process.exit(0), (e) => {
  out.fatal = { ok: false, error: String(e && e.stack || e) };
  process.stdout.write(JSON.stringify(out) + '\n');
  if (serverProc) serverProc.kill('SIGKILL');
  process.exit(1);
});
