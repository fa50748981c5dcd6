// The official @northflank/js-client, unchanged, against the project's Northflank stand-in
// (spec/support/northflank_service.lua), run by spec/providers/northflank_spec.lua.
//
// The client's documented context `host` points it at the stand-in, here through the stand-in's
// WebSocket front (spec/npm/northflank_front.mjs), since the client runs commands over a
// WebSocket on the API's host; STAND_IN_URL is the stand-in, STAND_IN_TOKEN and
// STAND_IN_PROJECT the credentials. Create a deployment service (polled until its deployment
// is COMPLETED), run a command through a shell and one as argv, delete the service, read it
// again (404), and try a wrong token; a session whose standard input comes in several messages. Prints `RESULT {json}`.
import { ApiClient, ApiClientInMemoryContextProvider } from '@northflank/js-client';
import { startFront } from './northflank_front.mjs';

const front = await startFront(process.env.STAND_IN_URL);
const projectId = process.env.STAND_IN_PROJECT;

async function client(token) {
  const contexts = new ApiClientInMemoryContextProvider();
  await contexts.addContext({ name: 'stand-in', token, host: front.url });
  return new ApiClient(contexts, { throwErrorOnHttpErrorCode: false });
}

const api = await client(process.env.STAND_IN_TOKEN);
const result = {};
try {
  const created = await api.create.service.deployment({
    parameters: { projectId },
    data: {
      name: 'sdk-check',
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
    { command: 'echo out $GREETING; echo err >&2; exit 3', shell: 'bash -c' });
  result.exit_code = run.commandResult.exitCode;
  result.completion_status = run.commandResult.status;
  result.stdout = run.stdOut;
  result.stderr = run.stdErr;
  const argv = await api.exec.execServiceCommand({ projectId, serviceId }, { command: ['echo', 'a b'] });
  result.argv_stdout = argv.stdOut;
  // standard input over the WebSocket: several payload messages, then the end of input
  const session = await api.exec.execServiceSession({ projectId, serviceId },
    { command: 'cat; echo done', shell: 'bash -c' });
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
  result.late_input = front.late;
  const deleted = await api.delete.service({ parameters: { projectId, serviceId } });
  result.deleted = !deleted.error;
  const missing = await api.get.service({ parameters: { projectId, serviceId } });
  result.missing_is_404 = missing.error?.status === 404;
  const wrong = await client('WRONG-token');
  const refused = await wrong.get.service({ parameters: { projectId, serviceId } });
  result.wrong_token_refused = refused.error?.status === 401;
} finally {
  await front.close();
}
console.log('RESULT ' + JSON.stringify(result));
