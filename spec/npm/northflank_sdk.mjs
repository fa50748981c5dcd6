// The official @northflank/js-client, unchanged, against the project's Northflank stand-in
// (spec/support/northflank_service.lua), run by spec/providers/northflank_spec.lua, over either
// of the client's two ways to run commands (EXEC_PATH):
//
// - `websocket` (the default): the client runs commands over a WebSocket on the API's host, so its
//   documented context `host` is the stand-in's WebSocket front (spec/npm/northflank_front.mjs);
// - `http2`: its documented `execLocationOverride` sends them to an exec host over HTTP/2
//   (`node:http2`, `POST /exec`, NDJSON), here the stand-in's own (spec/npm/northflank_exec.mjs,
//   h2c), while the context `host` is the stand-in itself for the REST calls.
//
// STAND_IN_URL is the stand-in, STAND_IN_TOKEN and STAND_IN_PROJECT the credentials. Create a
// deployment service (polled until its deployment is COMPLETED), run a command through a shell
// and one as argv, a session whose standard input comes in several messages, (http2) a wrong
// token's refused init, delete the service, read it again (404), and try a wrong token on the
// API. Both servers start in this process. Prints `RESULT {json}`.
import { ApiClient, ApiClientInMemoryContextProvider } from '@northflank/js-client';
import { startFront } from './northflank_front.mjs';
import { startExecHost } from './northflank_exec.mjs';

const http2 = process.env.EXEC_PATH === 'http2';
const server = http2 ? await startExecHost(process.env.STAND_IN_URL) : await startFront(process.env.STAND_IN_URL);
const projectId = process.env.STAND_IN_PROJECT;
const apiHost = http2 ? process.env.STAND_IN_URL : server.url;
// what every command takes besides its own options
const via = http2 ? { execLocationOverride: server.url } : {};

async function client(token) {
  const contexts = new ApiClientInMemoryContextProvider();
  await contexts.addContext({ name: 'stand-in', token, host: apiHost });
  return new ApiClient(contexts, { throwErrorOnHttpErrorCode: false });
}

const api = await client(process.env.STAND_IN_TOKEN);
const result = {};
try {
  const created = await api.create.service.deployment({
    parameters: { projectId },
    data: {
      name: http2 ? 'sdk-check-http2' : 'sdk-check',
      billing: { deploymentPlan: 'nf-compute-20' },
      deployment: {
        instances: 1, external: { imagePath: 'node:22-bookworm' },
        docker: { configType: 'customCommand', customCommand: 'sleep infinity' },
      },
      runtimeEnvironment: { GREETING: 'hi' },
    },
  });
  if (created.error) throw new Error(`create: ${JSON.stringify(created.error)}`);
  const serviceId = created.data.id;
  for (let i = 0; i < 20; i++) {
    const got = await api.get.service({ parameters: { projectId, serviceId } });
    if (got.error) throw new Error(`get: ${JSON.stringify(got.error)}`);
    const status = got.data.status?.deployment?.status;
    result.first_status ??= status;
    result.status = status;
    if (status === 'COMPLETED') break;
    await new Promise((r) => setTimeout(r, 50));
  }
  const run = await api.exec.execServiceCommand({ projectId, serviceId },
    { command: 'echo out $GREETING; echo err >&2; exit 3', shell: 'bash -c', ...via });
  result.exit_code = run.commandResult.exitCode;
  result.completion_status = run.commandResult.status;
  result.stdout = run.stdOut;
  result.stderr = run.stdErr;
  const argv = await api.exec.execServiceCommand({ projectId, serviceId }, { command: ['echo', 'a b'], ...via });
  result.argv_stdout = argv.stdOut;
  // standard input after init (a WebSocket's messages, or the same HTTP/2 stream): several payload
  // messages, then the end of input
  const session = await api.exec.execServiceSession({ projectId, serviceId },
    { command: 'cat; echo done', shell: 'bash -c', ...via });
  let catOut = '';
  session.stdOut.on('data', (d) => { catOut += d.toString(); });
  const finished = new Promise((r) => session.once('command-result', r));
  session.stdIn.write('first\n');
  await new Promise((r) => setTimeout(r, 50));
  session.stdIn.write('second\n');
  session.stdIn.end();
  const catResult = await finished;
  result.stdin_exit_code = catResult.exitCode;
  result.stdin_stdout = catOut;
  result.late_input = server.late;
  const wrong = await client('WRONG-token');
  if (http2) {
    try {
      await wrong.exec.execServiceCommand({ projectId, serviceId }, { command: ['true'], ...via });
      result.wrong_token = 'accepted';
    } catch (e) {
      result.wrong_token = /initialization failed/.test(e.message) ? 'refused' : e.message;
    }
    result.streams = server.streams;
  }
  const deleted = await api.delete.service({ parameters: { projectId, serviceId } });
  result.deleted = !deleted.error;
  const missing = await api.get.service({ parameters: { projectId, serviceId } });
  result.missing_is_404 = missing.error?.status === 404;
  const refused = await wrong.get.service({ parameters: { projectId, serviceId } });
  result.wrong_token_refused = refused.error?.status === 401;
} finally {
  await server.close();
}
console.log('RESULT ' + JSON.stringify(result));
process.exit(0);
