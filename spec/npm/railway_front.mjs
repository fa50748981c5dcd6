// The WebSocket exec bridge of the Railway stand-in (spec/support/railway_service.lua), a Node
// process on the `ws` package (no hand-written framing):
//
//   node spec/npm/railway_front.mjs <stand-in origin> <port file>
//
// It writes its port to the port file and serves `/ws/exec` as Railway's bridge does: the
// handshake offers the subprotocols `railway-shell, <shell token>` (a token the stand-in's
// generateShellToken gave; checked with the stand-in's `GET /_bridge/check`, 401 or 404 refuse
// the handshake with that status); then the client's text frame `init_exec` ({ command, cwd,
// env }), binary frames `0x02` + standard input, and `stdin_close`. The command then runs through
// the stand-in (`POST /_bridge/exec`), and its answer comes back as the bridge sends it: a
// `durable_session` text frame, binary frames `0x01` + stdout and `0x03` + stderr, the text frame
// `exit` ({ exit_code }), and a close (1000). A sandbox gone meanwhile closes with 1011 and no exit.
// A `signal` frame ({ signal }) goes to the running command (`POST /_bridge/signal`, with the
// exec's id; one that comes before stdin_close is sent once the command starts). `GET /quit` ends
// the process.
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import { WebSocketServer } from 'ws';

const [origin, portFile] = process.argv.slice(2);
const target = new URL(origin);
const CHUNK = 64 * 1024;

function call(method, path, headers, body) {
  return new Promise((resolve) => {
    const req = http.request({ host: target.hostname, port: target.port, method, path, headers }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(parts).toString() }));
      res.on('error', () => resolve({ status: 0, body: '' }));
    });
    req.on('error', () => resolve({ status: 0, body: '' }));
    req.end(body);
  });
}

const server = http.createServer((req, res) => {
  if (req.url === '/quit') {
    res.end('bye', () => process.exit(0));   // requests still waiting on the stand-in end with it
    return;
  }
  res.writeHead(404);
  res.end();
});
const wss = new WebSocketServer({ noServer: true, handleProtocols: (p) => (p.has('railway-shell') ? 'railway-shell' : false) });

server.on('upgrade', async (req, socket, head) => {
  const offered = (req.headers['sec-websocket-protocol'] ?? '').split(',').map((s) => s.trim());
  const token = offered[0] === 'railway-shell' ? offered[offered.length - 1] : '';
  const path = req.url.split('?')[0];
  const check = path === '/ws/exec' && token && token !== 'railway-shell'
    ? await call('GET', '/_bridge/check', { 'x-shell-token': token }) : { status: 404 };
  if (check.status !== 200) {
    const status = check.status === 0 ? 502 : check.status;
    socket.end(`HTTP/1.1 ${status} Refused\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`);
    return;
  }
  wss.handleUpgrade(req, socket, head, (ws) => session(ws, token));
});

let execs = 0;

function session(ws, token) {
  let init = null;
  const stdin = [];
  let started = false;
  const execId = `e${++execs}`;
  const pending = [];
  const signal = (name) => call('POST', '/_bridge/signal', { 'content-type': 'application/json' },
    JSON.stringify({ token, exec_id: execId, signal: name }));
  ws.on('message', async (data, binary) => {
    if (binary) {
      if (data[0] === 2) stdin.push(data.subarray(1));
      return;
    }
    let msg;
    try { msg = JSON.parse(data.toString()); } catch { return; }
    if (msg.type === 'signal' && typeof msg.data?.signal === 'string') {
      if (started) signal(msg.data.signal); else pending.push(msg.data.signal);
      return;
    }
    if (msg.type === 'init_exec') init = msg.data ?? {};
    if (msg.type !== 'stdin_close' || !init || started) return;
    started = true;
    const body = JSON.stringify({ token, exec_id: execId, command: init.command, cwd: init.cwd, env: init.env,
      stdin: Buffer.concat(stdin).toString('base64') });
    const running = call('POST', '/_bridge/exec', { 'content-type': 'application/json' }, body);
    for (const name of pending) signal(name);
    const answer = await running;
    if (ws.readyState !== ws.OPEN) return;
    if (answer.status !== 200) { ws.close(1011); return; }
    const r = JSON.parse(answer.body);
    ws.send(JSON.stringify({ type: 'durable_session', data: { durable_session_name: 'stand-in' } }));
    for (const [tag, text] of [[1, r.stdout], [3, r.stderr]]) {
      const bytes = Buffer.from(text, 'base64');
      for (let i = 0; i < bytes.length; i += CHUNK) {
        ws.send(Buffer.concat([Buffer.from([tag]), bytes.subarray(i, i + CHUNK)]), { binary: true });
      }
    }
    ws.send(JSON.stringify({ type: 'exit', data: { exit_code: r.exit_code } }));
    ws.close(1000);
  });
}

server.listen(0, '127.0.0.1', () => writeFileSync(portFile, String(server.address().port)));
