// The exec host of the Northflank stand-in (spec/support/northflank_service.lua): Northflank's
// `api-exec-<region>` host speaks HTTP/2 alone, and so does this one, on Node's own `node:http2`
// (no hand-written framing), in the clear (h2c with prior knowledge, which the official client
// dials for an `http://` execLocationOverride and libcurl for mayura's `http://` exec_url); an
// HTTP/1.1 request is refused by the protocol itself.
//
//   node spec/npm/northflank_exec.mjs <stand-in origin> <port file>   (writes its port; `/quit` ends it)
//   import { startExecHost } from './northflank_exec.mjs';             (host.url, host.late, host.close())
//
// `POST /exec` (content-type application/x-ndjson, x-target-key) is one HTTP/2 stream: the
// client's NDJSON messages (`init`, `payload`, `stdInEnd`) come in as it writes them, the answer's
// lines go out as the stand-in writes them. A request still open EARLY_MS after its `init` gets
// the init answer at once, as Northflank sends it (from the stand-in's `X-Init-Only` step; a
// refusal there is the whole answer). The stand-in runs a command once its request is whole, so
// the messages go on to the stand-in's own `POST /exec` (HTTP/1.1, loopback) at `stdInEnd`, at the
// end of the client's side of the stream, or, for a client that leaves its input open (the
// official client ends it only once the command completed), once no message came for QUIET_MS
// after the init answer: the command then gets the input sent so far and an end of file. Input
// after that is not passed on (counted in `late`). The client's headers go on, and the stand-in's status and
// headers (a 429's Retry-After) come back, as they are; a stream the client resets ends the
// stand-in's request.
import http from 'node:http';
import http2 from 'node:http2';
import { writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const QUIET_MS = 300;
const EARLY_MS = 20;
const HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'upgrade', 'proxy-connection', 'te']);

function typeOf(line) {
  try { return JSON.parse(line)?.type; } catch { return undefined; }
}

function exec(stream, headers, target, counts) {
  const msgs = [];
  let buf = '';
  let started = false;
  let welcomed = false;   // the client has its init answer already
  let quiet = null;
  let early = null;
  let up = null;
  const fail = () => { if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR); };
  // the client's headers go on as they came (the stand-in checks x-target-key and records them)
  const sent = {};
  for (const [k, v] of Object.entries(headers)) if (!k.startsWith(':') && !HOP.has(k)) sent[k] = v;
  delete sent['content-length'];
  const post = (extra, body, onAnswer) => {
    const req = http.request({ host: target.hostname, port: target.port, method: 'POST', path: '/exec',
      headers: { ...sent, ...extra } }, onAnswer);
    req.on('error', fail);
    req.end(body);
    return req;
  };
  const respond = (answer) => {
    const out = { ':status': answer.statusCode };
    for (const [k, v] of Object.entries(answer.headers)) if (!HOP.has(k) && k !== 'content-length') out[k] = v;
    stream.respond(out);
  };
  // Northflank answers `init` at once, and a client may wait for it before it sends its input: a
  // request still open shortly after its init is answered from the stand-in's `X-Init-Only` step.
  const welcome = () => {
    up = post({ 'x-init-only': '1' }, `${msgs[0]}\n`, (answer) => {
      let text = '';
      answer.setEncoding('utf8');
      answer.on('data', (d) => { text += d; });
      answer.on('end', () => {
        if (started || stream.destroyed) return;
        const first = text.split('\n')[0];
        if (answer.statusCode !== 200 || typeOf(first) !== 'init' || JSON.parse(first).data?.auth !== 'successful') {
          started = true;   // a refusal (or a fault) is the whole answer, as the stand-in gave it
          clearTimeout(quiet);
          respond(answer);
          stream.end(Buffer.from(text));
          return;
        }
        welcomed = true;
        respond(answer);
        stream.write(Buffer.from(`${first}\n`));
        clearTimeout(quiet);
        quiet = setTimeout(start, QUIET_MS);
      });
    });
  };
  const start = () => {
    if (started) return;
    started = true;
    clearTimeout(quiet);
    clearTimeout(early);
    if (up) up.destroy();
    if (buf) { msgs.push(buf); buf = ''; }
    if (!msgs.some((l) => typeOf(l) === 'stdInEnd')) msgs.push(JSON.stringify({ type: 'stdInEnd' }));
    up = post({}, msgs.join('\n') + '\n', (answer) => {
      if (stream.destroyed) { answer.destroy(); return; }
      answer.on('aborted', fail);
      answer.on('error', fail);
      if (!welcomed) { respond(answer); answer.pipe(stream); return; }
      // the init line was sent already: the rest goes on (as Buffers: strings written to an
      // HTTP/2 stream came out with corrupted bytes on Node 20 here)
      if (answer.statusCode !== 200) { stream.end(); return; }
      let rest = '';
      let first = true;
      answer.setEncoding('utf8');
      answer.on('data', (d) => {
        rest += d;
        const lines = rest.split('\n');
        rest = lines.pop();
        for (const line of lines) {
          if (first && typeOf(line) === 'init') { first = false; continue; }
          first = false;
          if (line) stream.write(Buffer.from(`${line}\n`));
        }
      });
      answer.on('end', () => stream.end(Buffer.from(rest)));
    });
  };
  stream.on('data', (chunk) => {
    if (started) { counts.late++; return; }
    buf += chunk.toString();
    const lines = buf.split('\n');
    buf = lines.pop();
    for (const line of lines) {
      if (!line) continue;
      msgs.push(line);
      if (typeOf(line) === 'stdInEnd') { start(); return; }
    }
    if (msgs.length > 0 && !early && !welcomed) early = setTimeout(welcome, EARLY_MS);
    if (welcomed) {
      clearTimeout(quiet);
      quiet = setTimeout(start, QUIET_MS);
    }
  });
  stream.on('end', start);
  stream.on('close', () => { clearTimeout(quiet); clearTimeout(early); if (up) up.destroy(); });
  stream.on('error', () => {});
}

export async function startExecHost(backend, onQuit) {
  const target = new URL(backend);
  const counts = { late: 0, streams: 0 };
  const server = http2.createServer();
  const sessions = new Set();
  server.on('session', (s) => { sessions.add(s); s.on('close', () => sessions.delete(s)); });
  server.on('stream', (stream, headers) => {
    counts.streams++;
    if (headers[':path'] === '/quit' && onQuit) {
      stream.respond({ ':status': 200 });
      stream.end('bye', onQuit);
      return;
    }
    if (headers[':method'] !== 'POST' || headers[':path'] !== '/exec') {
      stream.respond({ ':status': 404 });
      stream.end();
      return;
    }
    exec(stream, headers, target, counts);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    get late() { return counts.late; },
    get streams() { return counts.streams; },
    close: () => new Promise((resolve) => {
      for (const s of sessions) s.destroy();
      server.close(resolve);
    }),
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const [origin, portFile] = process.argv.slice(2);
  const host = await startExecHost(origin, () => process.exit(0));
  writeFileSync(portFile, String(new URL(host.url).port));
}
