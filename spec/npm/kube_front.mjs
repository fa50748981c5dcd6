// The HTTPS and WebSocket front of the Kubernetes stand-in (spec/support/kube_service.lua), a Node
// process on node:https and the `ws` package (no hand-written TLS or framing):
//
//   KUBE_FRONT_SECRET=<secret> node spec/npm/kube_front.mjs <stand-in origin> <port file>
//     [<cert file> <key file> <client CA file>]
//
// It writes its port to the port file and serves HTTPS on 127.0.0.1 with the certificate given
// (plain HTTP without one). A client certificate the client CA signed is checked here: the
// stand-in gets its subject's CN in `X-Kube-Client`, and every request the front passes on
// carries `X-Kube-Front: <secret>`, without which the stand-in believes no X-Kube-Client (the
// client's own X-Kube-* headers are dropped).
// Every request is passed on as it is to the stand-in (plain HTTP on loopback), its answer passed
// back as it comes (a watch streams). A WebSocket upgrade (attach, exec, portforward) is asked of
// the stand-in first: the same request with `X-Kube-Upgrade: <the subprotocols offered>`. An
// answer other than 101 is the client's answer (a Status, as an API server refuses a handshake);
// a 101 names the subprotocol in `X-Kube-Protocol`, the handshake is finished with it, and then
// every message goes both ways as it is: to the stand-in as a 4-byte big-endian length and the
// message's bytes (the channel byte first), and back the same way. The stand-in closing its
// connection closes the WebSocket (1000); the client closing the WebSocket closes the connection.
// The end of the process that started it ends it.
import { readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { WebSocketServer } from 'ws';

const [origin, portFile, certFile, keyFile, clientCaFile] = process.argv.slice(2);
const target = new URL(origin);
const secret = process.env.KUBE_FRONT_SECRET ?? '';

// The CN of a client certificate the client CA signed, or null.
function clientUser(req) {
  const s = req.socket;
  if (!s.authorized || typeof s.getPeerCertificate !== 'function') return null;
  const cn = s.getPeerCertificate()?.subject?.CN;
  return typeof cn === 'string' && cn !== '' ? cn : null;
}

// The request's headers as the stand-in gets them.
function inner(req) {
  const h = {};
  for (const [k, v] of Object.entries(req.headers)) if (!k.startsWith('x-kube-')) h[k] = v;
  h['x-kube-front'] = secret;
  const user = clientUser(req);
  if (user) h['x-kube-client'] = user;
  return h;
}

function serve(req, res) {
  const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url,
    headers: inner(req) }, (answer) => {
    res.writeHead(answer.statusCode, answer.headers);
    res.flushHeaders();   // a watch's head goes before its first event
    answer.pipe(res);
    answer.on('error', () => res.destroy());
  });
  up.on('error', () => {
    if (!res.headersSent) res.writeHead(502);
    res.end();
  });
  req.pipe(up);
  res.on('close', () => up.destroy());
}
const server = certFile
  ? https.createServer({ cert: readFileSync(certFile), key: readFileSync(keyFile), ca: readFileSync(clientCaFile),
    requestCert: true, rejectUnauthorized: false }, serve)
  : http.createServer(serve);
server.keepAliveTimeout = 5000;

const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, maxPayload: 64 * 1024 * 1024,
  handleProtocols: (offered, req) => req.kubeProtocol ?? false });

server.on('upgrade', (req, socket, head) => {
  const lines = [`${req.method} ${req.url} HTTP/1.1`];
  for (const [name, value] of Object.entries(inner(req))) {
    if (/^(connection|upgrade|content-length|transfer-encoding|sec-websocket-.*)$/i.test(name)) continue;
    for (const v of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${v}`);
  }
  lines.push(`X-Kube-Upgrade: ${req.headers['sec-websocket-protocol'] ?? ''}`);
  lines.push('Content-Length: 0');
  const back = net.connect({ host: target.hostname, port: Number(target.port) });
  let buf = Buffer.alloc(0);
  let ws = null;
  let pending = [];
  back.on('error', () => {
    if (ws) ws.close(1011); else socket.destroy();
  });
  back.write(lines.join('\r\n') + '\r\n\r\n');
  const onData = (data) => {
    buf = Buffer.concat([buf, data]);
    if (ws === null) {
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const headText = buf.subarray(0, end).toString('latin1');
      const status = Number(headText.split(' ')[1]);
      if (status !== 101) {
        // the stand-in's refusal is the client's answer, whole
        back.removeListener('data', onData);
        const chunks = [buf];
        back.on('data', (d) => chunks.push(d));
        back.on('end', () => { socket.end(Buffer.concat(chunks)); });
        return;
      }
      const m = headText.match(/\r\nX-Kube-Protocol: *([^\r\n]*)/i);
      req.kubeProtocol = m ? m[1] : undefined;
      buf = buf.subarray(end + 4);
      ws = 'pending';
      wss.handleUpgrade(req, socket, head, (client) => {
        ws = client;
        client.on('message', (msg) => {
          const len = Buffer.alloc(4);
          len.writeUInt32BE(msg.length);
          back.write(Buffer.concat([len, msg]));
        });
        client.on('close', () => back.end());
        client.on('error', () => back.destroy());
        for (const p of pending) client.send(p, { binary: true });
        pending = [];
        flush();
        if (back.readableEnded) client.close(1000);
      });
      return;
    }
    flush();
  };
  function flush() {
    while (buf.length >= 4) {
      const n = buf.readUInt32BE(0);
      if (buf.length < 4 + n) break;
      const msg = buf.subarray(4, 4 + n);
      buf = buf.subarray(4 + n);
      if (ws === 'pending') pending.push(Buffer.from(msg)); else ws.send(msg, { binary: true });
    }
  }
  back.on('data', onData);
  back.on('end', () => {
    if (ws && ws !== 'pending') ws.close(1000);
  });
  socket.on('error', () => back.destroy());
});

// the stand-in's process gone (this one handed to another parent), the front goes too
const parent = process.ppid;
setInterval(() => { if (process.ppid !== parent) process.exit(0); }, 500).unref();

server.listen(0, '127.0.0.1', () => {
  writeFileSync(portFile, String(server.address().port));
});
