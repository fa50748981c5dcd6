// The official CodeSandbox SDK, @codesandbox/sdk, unpatched, against the CodeSandbox stand-in
// (spec/support/codesandbox_service.lua) and its pitcher front (spec/npm/codesandbox_front.mjs):
// creates a sandbox (fork + start), connects (the pitcher WebSocket, MessagePack, client/join,
// setup/get), runs commands (shell/create, shell/out, shell/exit; a failing one throws), writes
// and reads files (text and bytes), lists a directory, hibernates and resumes it and shuts it
// down and resumes it (its files are kept), reads the sandbox, deletes it, and tries a wrong token. Prints RESULT {json}. Env: STAND_IN_URL, CSB_TOKEN.
import { CodeSandbox } from '@codesandbox/sdk';

async function failure(fn) {
  try {
    await fn();
    return null;
  } catch (e) {
    return { message: String(e.message ?? e), exitCode: e.exitCode ?? null };
  }
}

const sdk = new CodeSandbox(process.env.CSB_TOKEN, { baseUrl: process.env.STAND_IN_URL });
const sandbox = await sdk.sandboxes.create({ title: 'sdk check', hibernationTimeoutSeconds: 120,
  privacy: 'private' });
const client = await sandbox.connect();
const echo = await client.commands.run('echo hello from the sdk; pwd');
const failed = await failure(() => client.commands.run('echo partial; exit 3'));
await client.fs.writeTextFile('sdk/note.txt', 'a note\n');
const note = await client.fs.readTextFile('sdk/note.txt');
await client.fs.writeFile('sdk/raw.bin', new Uint8Array([0, 1, 2, 255, 10]));
const raw = Buffer.from(await client.fs.readFile('sdk/raw.bin')).toString('hex');
const listing = (await client.fs.readdir('sdk')).map((e) => `${e.type}:${e.name}`).sort();
const cat = await client.commands.run('cat sdk/note.txt');
client.dispose();
// the service keeps the files across hibernate/resume and shutdown/start
const kept = [];
for (const stop of ['hibernate', 'shutdown']) {
  await sdk.sandboxes[stop](sandbox.id);
  const again = await sdk.sandboxes.resume(sandbox.id);
  const c = await again.connect();
  kept.push(`${stop}:${again.bootupType}:${await c.fs.readTextFile('sdk/note.txt')}`);
  c.dispose();
}
const got = await sdk.sandboxes.get(sandbox.id);
await sdk.sandboxes.delete(sandbox.id);
const gone = await failure(() => sdk.sandboxes.get(sandbox.id));
const wrong = await failure(() => new CodeSandbox('csb_WRONG', { baseUrl: process.env.STAND_IN_URL })
  .sandboxes.create());

console.log('RESULT ' + JSON.stringify({ id: sandbox.id, bootup: sandbox.bootupType, echo, failed, note, raw,
  listing, cat, kept, title: got.title, gone: gone && gone.message, wrong: wrong && wrong.message }));
process.exit(0);
