// The WebSocket side of the Northflank stand-in (spec/support/northflank_service.lua), for the
// official @northflank/js-client, whose commands go over a WebSocket on the API's own host
// (`ws://<host>/v1/command-exec/projects/{p}/services/{s}`). The stand-in itself speaks HTTP/1.1
// only, so this front, started in the Node process that runs the client, listens on a loopback
// port of its own: plain HTTP requests are passed to the stand-in unchanged, and a WebSocket at
// the exec path (accepted with the `ws` package, not hand-written framing) becomes one
// `POST /exec` to the stand-in (its NDJSON exec), whose answer lines go back as WebSocket
// messages, the socket closing (1000) after the last. The client's first message (`init`) goes
// on with the project and service of the URL added, followed by `stdInEnd`: standard input sent
// after `init` is not passed on (the stand-in runs a command once its request is whole).
//
//   import { startFront } from './northflank_front.mjs';
//   const front = await startFront('http://127.0.0.1:1234');   // front.url, front.close()
import http from 'node:http';
import { WebSocketServer } from 'ws';

const EXEC_PATH = /^\/v1\/command-exec\/(?:teams\/([^/]+)\/)?projects\/([^/]+)\/services\/([^/?]+)$/;

export async function startFront(backend) {
  const target = new URL(backend);
  const server = http.createServer((req, res) => {
    const up = http.request({
      host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers,
    }, (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    });
    up.on('error', () => { res.destroy(); });
    req.pipe(up);
  });
  const wss = new WebSocketServer({ noServer: true });
  server.on('upgrade', (req, socket, head) => {
    const m = EXEC_PATH.exec(req.url);
    if (!m) { socket.destroy(); return; }
    wss.handleUpgrade(req, socket, head, (ws) => bridge(ws, target, { teamId: m[1], projectId: m[2], serviceId: m[3] }));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => { wss.close(); server.close(resolve); server.closeAllConnections(); }),
  };
}

function bridge(ws, target, ids) {
  ws.once('message', (data) => {
    let init;
    try { init = JSON.parse(data.toString()); } catch { ws.close(1011); return; }
    const context = { ...(init?.data?.context ?? {}), projectId: ids.projectId, serviceId: ids.serviceId };
    if (ids.teamId) context.teamId = ids.teamId;
    init = { ...init, data: { ...init.data, context } };
    const body = `${JSON.stringify(init)}\n${JSON.stringify({ type: 'stdInEnd' })}\n`;
    const up = http.request({
      host: target.hostname, port: target.port, method: 'POST', path: '/exec',
      headers: { 'content-type': 'application/x-ndjson', 'x-target-key': ids.serviceId + (context.instanceName ?? 'na') },
    }, (answer) => {
      let buf = '';
      answer.setEncoding('utf8');
      answer.on('data', (chunk) => {
        buf += chunk;
        const lines = buf.split('\n');
        buf = lines.pop();
        for (const line of lines) if (line) ws.send(line);
      });
      answer.on('end', () => { if (buf) ws.send(buf); ws.close(1000); });
    });
    up.on('error', () => ws.close(1011));
    ws.on('close', () => up.destroy());
    up.end(body);
  });
}
