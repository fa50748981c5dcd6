// The WebSocket front of the CodeSandbox pitcher stand-in (spec/support/codesandbox_service.lua),
// a Node process on the `ws` package (no hand-written framing):
//
//   node spec/npm/codesandbox_front.mjs <stand-in origin> <port file>
//
// It writes its port to the port file and serves the pitcher's WebSocket, `/?token=<pitcher
// token>`: the token is checked with the stand-in's `GET /_pitcher/check` (401 or 404 refuse the
// handshake with that status). It carries frames and nothing else, so the stand-in reads and
// writes every MessagePack frame itself: each binary message from the client goes unchanged to
// `POST /_pitcher/in?conn=<id>`, in order; `GET /_pitcher/out?conn=<id>&token=<token>` is a
// stream of 4-byte big-endian lengths and frames, each sent to the client as a binary message.
// An empty text message (the SDK's keep-alive) is answered with one. When the stand-in ends the
// stream (the VM stopped or was deleted) the socket closes with 1011; when the client goes, the
// stand-in is told (`POST /_pitcher/close`). `GET /quit` ends the process.
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import { WebSocketServer } from 'ws';

const [origin, portFile] = process.argv.slice(2);
const target = new URL(origin);
let seq = 0;

function call(method, path, body) {
  return new Promise((resolve) => {
    const req = http.request({ host: target.hostname, port: target.port, method, path,
      headers: body ? { 'content-type': 'application/octet-stream' } : {} }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
      res.on('error', () => resolve(0));
    });
    req.on('error', () => resolve(0));
    req.end(body);
  });
}

const server = http.createServer((req, res) => {
  if (req.url === '/quit') {
    res.end('bye', () => process.exit(0));
    return;
  }
  res.writeHead(404);
  res.end();
});
const wss = new WebSocketServer({ noServer: true });

server.on('upgrade', async (req, socket, head) => {
  const url = new URL(req.url, 'http://front');
  const token = url.searchParams.get('token') ?? '';
  const status = url.pathname === '/' && token
    ? await call('GET', `/_pitcher/check?token=${encodeURIComponent(token)}`) : 404;
  if (status !== 200) {
    const code = status === 0 ? 502 : status;
    socket.end(`HTTP/1.1 ${code} Refused\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`);
    return;
  }
  wss.handleUpgrade(req, socket, head, (ws) => session(ws, token));
});

function session(ws, token) {
  seq += 1;
  const conn = `c${process.pid}-${seq}`;
  let ready;
  let inbound = new Promise((resolve) => { ready = resolve; });   // frames wait for the stream
  const out = http.get({ host: target.hostname, port: target.port,
    path: `/_pitcher/out?conn=${conn}&token=${encodeURIComponent(token)}` }, (res) => {
    if (res.statusCode !== 200) { ws.close(1011); res.resume(); return; }
    ready();
    let buf = Buffer.alloc(0);
    res.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
        const n = buf.readUInt32BE(0);
        if (ws.readyState === ws.OPEN) ws.send(buf.subarray(4, 4 + n), { binary: true });
        buf = buf.subarray(4 + n);
      }
    });
    res.on('end', () => ws.close(1011));
    res.on('error', () => ws.close(1011));
  });
  out.on('error', () => ws.close(1011));
  ws.on('message', (data, binary) => {
    if (!binary) {
      if (ws.readyState === ws.OPEN) ws.send('');
      return;
    }
    const frame = Buffer.from(data);
    inbound = inbound.then(() => call('POST', `/_pitcher/in?conn=${conn}`, frame));
  });
  ws.on('close', () => {
    out.destroy();
    call('POST', `/_pitcher/close?conn=${conn}`);
  });
}

server.listen(0, '127.0.0.1', () => writeFileSync(portFile, String(server.address().port)));
