// The WebSocket side of the Northflank stand-in (spec/support/northflank_service.lua), for the
// official @northflank/js-client, whose commands go over a WebSocket on the API's own host
// (`ws://<host>/v1/command-exec/projects/{p}/services/{s}`). The stand-in itself speaks HTTP/1.1
// only, so this front, started in the Node process that runs the client, listens on a loopback
// port of its own: plain HTTP requests are passed to the stand-in unchanged, and a WebSocket at
// the exec path (accepted with the `ws` package, not hand-written framing) becomes one
// `POST /exec` to the stand-in (its NDJSON exec), whose answer lines go back as WebSocket
// messages, the socket closing (1000) after the last. The client's first message (`init`) goes
// on with the project and service of the URL added, then its standard input (see bridge below).
//
//   import { startFront } from './northflank_front.mjs';
//   const front = await startFront('http://127.0.0.1:1234');   // front.url, front.close()
import http from 'node:http';
import { WebSocketServer } from 'ws';

const EXEC_PATH = /^\/v1\/command-exec\/(?:teams\/([^/]+)\/)?projects\/([^/]+)\/services\/([^/?]+)$/;

export async function startFront(backend) {
  const target = new URL(backend);
  const counts = { late: 0 };
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
    wss.handleUpgrade(req, socket, head,
      (ws) => bridge(ws, target, { teamId: m[1], projectId: m[2], serviceId: m[3] }, counts));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    get late() { return counts.late; },
    close: () => new Promise((resolve) => { wss.close(); server.close(resolve); server.closeAllConnections(); }),
  };
}

// The client's messages: `init`, then standard input (`payload`) and `stdInEnd`. The stand-in runs
// a command once its request is whole, so the front sends them on at `stdInEnd`, or, for a client
// that never ends its input (the client ends it only once the command completed), once no message
// came for QUIET_MS after the init answer: the command then gets the input sent so far and an end of file where
// Northflank would leave its standard input open. Input that comes after the command started is
// not passed on (counted in front.late).
const QUIET_MS = 300;

function bridge(ws, target, ids, counts) {
  const msgs = [];
  let init = null;
  let started = false;
  let welcomed = false;
  let initSent = false;
  const sendInit = (line) => { if (!initSent) { initSent = true; ws.send(line); } };
  let quiet = null;
  const headers = () => ({ 'content-type': 'application/x-ndjson',
    'x-target-key': ids.serviceId + (init.data.context.instanceName ?? 'na') });
  // the init answer comes at once, as Northflank sends it: the client sends its input after it
  const welcome = () => {
    const up = http.request({ host: target.hostname, port: target.port, method: 'POST', path: '/exec',
      headers: { ...headers(), 'x-init-only': '1' } }, (answer) => {
      let buf = '';
      answer.setEncoding('utf8');
      answer.on('data', (chunk) => { buf += chunk; });
      answer.on('end', () => {
        if (started) return;
        const first = buf.split('\n')[0];
        let ok = false;
        try { const v = JSON.parse(first); ok = v.type === 'init' && v.data?.auth === 'successful'; } catch { ok = false; }
        if (!ok) { start(); return; }   // the exec answers the refusal itself
        sendInit(first);
        welcomed = true;
        clearTimeout(quiet);
        quiet = setTimeout(start, QUIET_MS);
      });
    });
    up.on('error', () => ws.close(1011));
    up.end(`${JSON.stringify(init)}\n`);
  };
  const start = () => {
    if (started || !init) return;
    started = true;
    clearTimeout(quiet);
    const lines = [JSON.stringify(init), ...msgs];
    if (!msgs.some((m) => m.includes('"stdInEnd"'))) lines.push(JSON.stringify({ type: 'stdInEnd' }));
    const body = lines.join('\n') + '\n';
    const up = http.request({ host: target.hostname, port: target.port, method: 'POST', path: '/exec',
      headers: headers() }, (answer) => {
      let buf = '';
      answer.setEncoding('utf8');
      answer.on('data', (chunk) => {
        buf += chunk;
        const parts = buf.split('\n');
        buf = parts.pop();
        for (const line of parts) {
          if (!line) continue;
          if (line.startsWith('{"type":"init"') || line.includes('"type":"init"')) { sendInit(line); continue; }
          ws.send(line);
        }
      });
      answer.on('end', () => { if (buf) ws.send(buf); ws.close(1000); });
    });
    up.on('error', () => ws.close(1011));
    ws.on('close', () => up.destroy());
    up.end(body);
  };
  ws.on('message', (data) => {
    const text = data.toString();
    if (started) { counts.late++; return; }
    if (!init) {
      try { init = JSON.parse(text); } catch { ws.close(1011); return; }
      const context = { ...(init?.data?.context ?? {}), projectId: ids.projectId, serviceId: ids.serviceId };
      if (ids.teamId) context.teamId = ids.teamId;
      init = { ...init, data: { ...init.data, context } };
      welcome();
    } else {
      msgs.push(text);
    }
    let type;
    try { type = JSON.parse(text)?.type; } catch { type = null; }
    if (type === 'stdInEnd') { start(); return; }
    if (welcomed) {
      clearTimeout(quiet);
      quiet = setTimeout(start, QUIET_MS);
    }
  });
}
