// The two streaming endpoints of a Kubernetes API server, for spec/providers/kubernetes_spec.lua,
// on the `ws` package: a Pod's `attach` and `portforward`, framed as the API server frames them
// (`v5.channel.k8s.io` / `v4.channel.k8s.io`: every binary message's first byte is its channel).
//
//   node kube_streams.mjs PORTFILE AGENT WORKDIR
//
// It writes its port to PORTFILE. An attach to .../pods/NAME/attach starts AGENT --stdio (the
// Pod's container: one per name, started at its first attach) with pipes: channel 0 goes to its
// standard input, its output comes back on channel 1 and its errors on 2; when it ends, channel 3
// carries a Status and the connection closes. DELETE /pods/NAME kills it (SIGKILL), as a Pod
// deleted behind the host. A port-forward to .../pods/NAME/portforward?ports=P connects to
// 127.0.0.1:P and sends the port (2 bytes, little-endian) first on channels 0 and 1, as the
// server does. A handshake without `Authorization: Bearer good` is refused with 403; one that
// offers neither subprotocol with 400. GET /quit ends the server.
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { WebSocketServer } from 'ws';

const [portfile, agent, workdir] = process.argv.slice(2);
const pods = new Map();   // name -> child process
// a Pod whose name begins with v4- is served as by an API server older than v5 (1.29 and before)
const wss = new WebSocketServer({ noServer: true,
  handleProtocols: (protocols, req) => (req.url.includes('/pods/v4-') ? [] : ['v5.channel.k8s.io'])
    .concat(['v4.channel.k8s.io', 'portforward.k8s.io']).find((p) => protocols.has(p)) ?? false });
const frame = (channel, data) => Buffer.concat([Buffer.from([channel]), data]);

const server = http.createServer((req, res) => {
  const m = req.url.match(/^\/api\/v1\/namespaces\/[^/]+\/pods\/([^/?]+)$/);
  if (req.method === 'DELETE' && m) {
    const child = pods.get(m[1]);
    if (child) child.kill('SIGKILL');
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end('{}');
    return;
  }
  if (req.url === '/quit') {
    for (const child of pods.values()) child.kill('SIGKILL');
    res.end(() => process.exit(0));
    return;
  }
  res.writeHead(404);
  res.end();
});

function attach(ws, name) {
  let child = pods.get(name);
  if (!child) {
    child = spawn(agent, ['--stdio', '--lifetime-ms', '60000', '--workdir', workdir], { stdio: 'pipe' });
    child.stdin.on('error', () => {});   // written to after it ended
    pods.set(name, child);
  }
  ws.on('message', (data) => {
    if (data[0] === 0 && child.stdin.writable) child.stdin.write(data.subarray(1));
  });
  child.stdout.on('data', (d) => ws.send(frame(1, d)));
  child.stderr.on('data', (d) => ws.send(frame(2, d)));
  child.on('exit', () => {
    if (ws.readyState !== ws.OPEN) return;
    ws.send(frame(3, Buffer.from(JSON.stringify({ kind: 'Status', status: 'Failure', reason: 'NonZeroExitCode' }))));
    ws.close(1000);
  });
}

function portforward(ws, port) {
  const head = Buffer.from([port & 255, port >> 8]);
  ws.send(frame(0, head));
  ws.send(frame(1, head));
  const sock = net.connect(port, '127.0.0.1');
  sock.on('data', (d) => ws.send(frame(0, d)));
  sock.on('error', () => { ws.send(frame(1, Buffer.from('connection refused'))); ws.close(1000); });
  sock.on('close', () => ws.close(1000));
  ws.on('message', (data) => { if (data[0] === 0) sock.write(data.subarray(1)); });
  ws.on('close', () => sock.destroy());
}

server.on('upgrade', (req, socket, head) => {
  if (req.headers.authorization !== 'Bearer good') {
    socket.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
    return;
  }
  const url = new URL(req.url, 'http://x');
  const m = url.pathname.match(/^\/api\/v1\/namespaces\/[^/]+\/pods\/([^/]+)\/(attach|portforward)$/);
  if (!m) {
    socket.end('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
    return;
  }
  wss.handleUpgrade(req, socket, head, (ws) => {
    if (!ws.protocol) { ws.close(1002); return; }
    if (m[2] === 'attach') attach(ws, m[1]);
    else portforward(ws, Number(url.searchParams.get('ports')));
  });
});
server.listen(0, '127.0.0.1', () => writeFileSync(portfile, String(server.address().port)));
