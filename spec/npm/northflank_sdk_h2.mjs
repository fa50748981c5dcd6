// The official @northflank/js-client, unchanged, running commands over its HTTP/2 exec path
// against the project's Northflank stand-in (spec/support/northflank_service.lua), run by
// spec/providers/northflank_spec.lua.
//
// The client's documented `execLocationOverride` sends its commands to an exec host over HTTP/2
// (`node:http2`, `POST /exec`, NDJSON) instead of its default WebSocket; here the host is the
// stand-in's own (spec/npm/northflank_exec.mjs, h2c, started in this process). Its context `host`
// is the stand-in (STAND_IN_URL) for the REST calls; STAND_IN_TOKEN and STAND_IN_PROJECT are the
// credentials. Create a service (polled until COMPLETED), a command through a shell, one as argv,
// a session whose standard input comes in several messages, a wrong token's refused init, then
// delete the service. Prints `RESULT {json}`.
import { ApiClient, ApiClientInMemoryContextProvider } from '@northflank/js-client';
import { startExecHost } from './northflank_exec.mjs';

const host = await startExecHost(process.env.STAND_IN_URL);
const projectId = process.env.STAND_IN_PROJECT;
const execLocationOverride = host.url;

async function client(token) {
  const contexts = new ApiClientInMemoryContextProvider();
  await contexts.addContext({ name: 'stand-in', token, host: process.env.STAND_IN_URL });
  return new ApiClient(contexts, { throwErrorOnHttpErrorCode: false });
}

const api = await client(process.env.STAND_IN_TOKEN);
const result = {};
try {
  const created = await api.create.service.deployment({
    parameters: { projectId },
    data: {
      name: 'sdk-h2-check',
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
    if (got.data?.status?.deployment?.status === 'COMPLETED') break;
    await new Promise((r) => setTimeout(r, 50));
  }
  const run = await api.exec.execServiceCommand({ projectId, serviceId },
    { command: 'echo out $GREETING; echo err >&2; exit 3', shell: 'bash -c', execLocationOverride });
  result.exit_code = run.commandResult.exitCode;
  result.completion_status = run.commandResult.status;
  result.stdout = run.stdOut;
  result.stderr = run.stdErr;
  const argv = await api.exec.execServiceCommand({ projectId, serviceId },
    { command: ['echo', 'a b'], execLocationOverride });
  result.argv_stdout = argv.stdOut;
  // standard input on the same HTTP/2 stream: several payload messages, then the end of input
  const session = await api.exec.execServiceSession({ projectId, serviceId },
    { command: 'cat; echo done', shell: 'bash -c', execLocationOverride });
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
  result.late_input = host.late;
  const wrong = await client('WRONG-token');
  try {
    await wrong.exec.execServiceCommand({ projectId, serviceId }, { command: ['true'], execLocationOverride });
    result.wrong_token = 'accepted';
  } catch (e) {
    result.wrong_token = /initialization failed/.test(e.message) ? 'refused' : e.message;
  }
  result.streams = host.streams;
  const deleted = await api.delete.service({ parameters: { projectId, serviceId } });
  result.deleted = !deleted.error;
} finally {
  await host.close();
}
console.log('RESULT ' + JSON.stringify(result));
process.exit(0);
