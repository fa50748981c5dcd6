// A WebSocket server for spec/core/ws_spec.lua, on the `ws` package: it writes its port to the
// file named by its first argument, then on each connection first sends (text) the JSON
// { auth, protocol, path } of the handshake, then echoes every message (text as text, binary
// as binary). Messages that do more: 'big' gets 2 MiB of binary back, 'close-4001' closes with
// code 4001, 'drop' ends the TCP connection without a close, 'quit' ends the server. A
// handshake for the path /refuse is answered 401, and one for /hang never. With a directory as
// its second argument it serves TLS (its server.pem and server-key.pem), asks for a client
// certificate of the authority ca.pem, and says the one it got (its CN) as `client`.
import { readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { WebSocketServer } from 'ws';

const tls = process.argv[3];
const answer404 = (req, res) => { res.writeHead(404); res.end(); };
const server = tls
  ? https.createServer({ key: readFileSync(`${tls}/server-key.pem`), cert: readFileSync(`${tls}/server.pem`),
    ca: readFileSync(`${tls}/ca.pem`), requestCert: true, rejectUnauthorized: false }, answer404)
  : http.createServer(answer404);
const wss = new WebSocketServer({ noServer: true, handleProtocols: (protocols) => [...protocols][0] ?? false });
server.on('upgrade', (req, socket, head) => {
  if (req.url === '/refuse') {
    socket.end('HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
    return;
  }
  if (req.url === '/hang') return;
  wss.handleUpgrade(req, socket, head, (ws) => {
    const hello = { auth: req.headers.authorization ?? null, protocol: ws.protocol, path: req.url };
    if (tls) hello.client = req.socket.authorized ? req.socket.getPeerCertificate().subject.CN : null;
    ws.send(JSON.stringify(hello));
    ws.on('message', (data, binary) => {
      const text = binary ? null : data.toString();
      if (text === 'big') ws.send(Buffer.alloc(2 * 1024 * 1024, 7), { binary: true });
      else if (text === 'close-4001') ws.close(4001, 'asked');
      else if (text === 'drop') ws.terminate();
      else if (text === 'quit') { ws.close(1000); wss.close(); server.close(); server.closeAllConnections(); }
      else ws.send(data, { binary });
    });
  });
});
server.listen(0, '127.0.0.1', () => writeFileSync(process.argv[2], String(server.address().port)));
