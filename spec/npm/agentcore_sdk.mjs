// The official AWS client, @aws-sdk/client-bedrock-agentcore, unpatched, against the AgentCore
// Code Interpreter stand-in (spec/support/agentcore_service.lua): it signs every request with its
// own SigV4 signer and decodes the event-stream answers itself. Starts a session, runs a command
// (executeCommand), writes a file and reads it back (writeFiles, readFiles), reads the session,
// stops it, and tries a wrong secret and a stopped session. Prints RESULT {json}.
// Env: STAND_IN_URL, AWS_KEY_ID, AWS_SECRET, AWS_TOKEN, AWS_REGION.
import {
  BedrockAgentCoreClient, StartCodeInterpreterSessionCommand, InvokeCodeInterpreterCommand,
  GetCodeInterpreterSessionCommand, StopCodeInterpreterSessionCommand,
} from '@aws-sdk/client-bedrock-agentcore';

const CI = 'aws.codeinterpreter.v1';

function client(secret) {
  return new BedrockAgentCoreClient({
    endpoint: process.env.STAND_IN_URL, region: process.env.AWS_REGION, maxAttempts: 1,
    credentials: { accessKeyId: process.env.AWS_KEY_ID, secretAccessKey: secret, sessionToken: process.env.AWS_TOKEN },
  });
}

// Every event of an invoke's stream, as { kind, value }.
async function invoke(c, sessionId, name, args) {
  const out = await c.send(new InvokeCodeInterpreterCommand({ codeInterpreterIdentifier: CI, sessionId, name,
    arguments: args }));
  const events = [];
  for await (const ev of out.stream) {
    const kind = Object.keys(ev).find((k) => ev[k] !== undefined);
    events.push({ kind, value: ev[kind] });
  }
  return { sessionId: out.sessionId, events };
}

async function failure(fn) {
  try {
    await fn();
    return null;
  } catch (e) {
    return { name: e.name, status: e.$metadata && e.$metadata.httpStatusCode };
  }
}

const c = client(process.env.AWS_SECRET);
const started = await c.send(new StartCodeInterpreterSessionCommand({ codeInterpreterIdentifier: CI, name: 'sdk',
  sessionTimeoutSeconds: 300 }));
const id = started.sessionId;
const run = await invoke(c, id, 'executeCommand', { command: 'echo out; echo err >&2; exit 3' });
const r = run.events[0].value;
const bytes = Buffer.from([0, 1, 2, 255, 10]);
const write = await invoke(c, id, 'writeFiles', { content: [{ path: 'sdk/note.txt', text: 'hello from the sdk\n' },
  { path: 'sdk/raw.bin', blob: new Uint8Array(bytes) }] });
const read = await invoke(c, id, 'readFiles', { paths: ['sdk/note.txt', 'sdk/raw.bin'] });
const blocks = read.events[0].value.content;
const cat = await invoke(c, id, 'executeCommand', { command: 'cat sdk/note.txt' });
const got = await c.send(new GetCodeInterpreterSessionCommand({ codeInterpreterIdentifier: CI, sessionId: id }));
const wrong = await failure(() => client(process.env.AWS_SECRET + 'x').send(
  new GetCodeInterpreterSessionCommand({ codeInterpreterIdentifier: CI, sessionId: id })));
const stopped = await c.send(new StopCodeInterpreterSessionCommand({ codeInterpreterIdentifier: CI, sessionId: id }));
const after = await failure(() => invoke(c, id, 'executeCommand', { command: 'true' }));

console.log('RESULT ' + JSON.stringify({
  start: { id, interpreter: started.codeInterpreterIdentifier, created: started.createdAt instanceof Date },
  run: { session: run.sessionId, events: run.events.length, kind: run.events[0].kind,
    stdout: r.structuredContent.stdout, stderr: r.structuredContent.stderr, exit: r.structuredContent.exitCode,
    is_error: r.isError, text: r.content[0].text },
  write: { kind: write.events[0].kind, is_error: !!write.events[0].value.isError },
  read: blocks.map((b) => ({ type: b.type, uri: b.resource.uri, text: b.resource.text,
    blob: b.resource.blob && Buffer.from(b.resource.blob).toString('hex') })),
  cat: cat.events[0].value.structuredContent.stdout,
  get: { status: got.status, timeout: got.sessionTimeoutSeconds },
  wrong, stop: { id: stopped.sessionId, updated: stopped.lastUpdatedAt instanceof Date }, after,
}));
