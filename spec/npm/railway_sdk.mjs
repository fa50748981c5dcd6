// The official `railway` SDK, unchanged, against the project's Railway stand-in
// (spec/support/railway_service.lua), run by spec/providers/railway_spec.lua.
//
// The SDK's documented `endpoint` and `tcpProxyWsEndpoint` options point its GraphQL client
// and its WebSocket exec at the stand-in (STAND_IN_URL, STAND_IN_WS: the stand-in's bridge,
// spec/npm/railway_front.mjs); on Node 20 its `webSocketImpl` is the `ws` package (Node 22 has
// a global WebSocket). `token` and `environmentId` are its own options (STAND_IN_TOKEN,
// STAND_IN_ENV). Create with variables and an idle timeout (polled from CREATING to RUNNING),
// a command with its exit code, stdout and stderr, a command's kill, connect, list, refresh, destroy, and a
// wrong token. Prints `RESULT {json}`.
import { Sandbox, RailwayGraphQLError } from 'railway';
import WebSocket from 'ws';

const options = {
  endpoint: process.env.STAND_IN_URL,
  tcpProxyWsEndpoint: process.env.STAND_IN_WS,
  webSocketImpl: WebSocket,
  token: process.env.STAND_IN_TOKEN,
  environmentId: process.env.STAND_IN_ENV,
};

// STAND_IN_CONNECT: only connect to that sandbox (one mayura made with a public domain, whose
// answers carry `domains`), read it and run a command in it.
if (process.env.STAND_IN_CONNECT) {
  const made = await Sandbox.connect(process.env.STAND_IN_CONNECT, options);
  const ran = await made.exec('cat /workspace/index.html');
  console.log('RESULT ' + JSON.stringify({ status: made.status, networkIsolation: made.networkIsolation,
    exit_code: ran.exitCode, stdout: ran.stdout }));
  process.exit(0);
}

const result = {};
const sandbox = await Sandbox.create({ ...options, env: { GREETING: 'hi' }, idleTimeoutMinutes: 7, region: 'us-east4' });
result.id = sandbox.id;
result.status = sandbox.status;
const run = await sandbox.exec('echo out $GREETING; echo err >&2; exit 3');
result.exit_code = run.exitCode;
result.stdout = run.stdout;
result.stderr = run.stderr;
// kill(): a KILL signal frame, delivered to the command's process group
const started = Date.now();
const running = sandbox.exec('echo started; sleep 30');
await new Promise((r) => setTimeout(r, 500));
result.kill_sent = await running.kill('KILL');
const killed = await running;
result.killed_exit_code = killed.exitCode;
result.killed_stdout = killed.stdout;
result.killed_fast = Date.now() - started < 10000;
const again = await Sandbox.connect(sandbox.id, options);
result.connected = again.id === sandbox.id;
const listed = await Sandbox.list(options);
const items = Array.isArray(listed) ? listed : (listed.sandboxes ?? listed.items ?? listed.data ?? []);
result.listed = items.some((s) => (s.id ?? s.node?.id) === sandbox.id);
await sandbox.destroy();
await sandbox.refresh();
result.after_destroy = sandbox.status;
try {
  await Sandbox.create({ ...options, token: 'WRONG-token' });
  result.wrong_token = 'accepted';
} catch (e) {
  result.wrong_token = e instanceof RailwayGraphQLError ? 'graphql_error' : String(e);
}
console.log('RESULT ' + JSON.stringify(result));
