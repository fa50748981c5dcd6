// AWS's own SigV4 signer (@smithy/signature-v4, the signer of every AWS SDK for JavaScript v3)
// signs requests to the AgentCore stand-in, which must accept them; and one signed with a wrong
// secret, which it must refuse. Prints RESULT {json}. Env: STAND_IN_URL, AWS_KEY_ID,
// AWS_SECRET, AWS_TOKEN, AWS_REGION.
import { createHash, createHmac } from 'node:crypto';
import { SignatureV4 } from '@smithy/signature-v4';

class Sha256 {
  constructor(secret) { this.h = secret ? createHmac('sha256', secret) : createHash('sha256'); }
  update(data) { this.h.update(data); }
  async digest() { return new Uint8Array(this.h.digest()); }
}

const url = new URL(process.env.STAND_IN_URL);
const region = process.env.AWS_REGION;

async function send(secret, method, path, query, body) {
  const signer = new SignatureV4({
    credentials: { accessKeyId: process.env.AWS_KEY_ID, secretAccessKey: secret, sessionToken: process.env.AWS_TOKEN },
    region, service: 'bedrock-agentcore', sha256: Sha256,
  });
  const headers = { host: url.host };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const signed = await signer.sign({ method, protocol: 'http:', hostname: url.hostname, port: Number(url.port),
    path, query, headers, body });
  const qs = new URLSearchParams(query || {}).toString();
  const res = await fetch(`${url.origin}${path}${qs ? '?' + qs : ''}`, { method, headers: signed.headers, body });
  return { status: res.status, body: await res.json() };
}

const ci = '/code-interpreters/aws.codeinterpreter.v1';
const start = await send(process.env.AWS_SECRET, 'PUT', ci + '/sessions/start', undefined,
  JSON.stringify({ name: 'sdk', sessionTimeoutSeconds: 120, clientToken: 'b7a6d7c4-0d8e-4a53-9a7e-3c2f1a9e0001' }));
const id = start.body.sessionId;
const got = await send(process.env.AWS_SECRET, 'GET', ci + '/sessions/get', { sessionId: id });
const wrong = await send(process.env.AWS_SECRET + 'x', 'GET', ci + '/sessions/get', { sessionId: id });
const stop = await send(process.env.AWS_SECRET, 'PUT', ci + '/sessions/stop', { sessionId: id });
console.log('RESULT ' + JSON.stringify({ start: start.status, id, get: got.status, status: got.body.status,
  wrong: wrong.status, stop: stop.status }));
