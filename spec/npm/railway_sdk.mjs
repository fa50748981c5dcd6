// The official `railway` SDK, unchanged, against the project's Railway stand-in
// (spec/support/railway_service.lua), run by spec/providers/railway_spec.lua.
//
// The SDK's documented `endpoint` option points its GraphQL client at the stand-in
// (STAND_IN_URL); `token` and `environmentId` are its own options (STAND_IN_TOKEN,
// STAND_IN_ENV). Its commands and files go over a WebSocket bridge that this check does
// not reach (the stand-in serves the GraphQL API only): create with variables and an idle
// timeout (polled from CREATING to RUNNING), connect, list, refresh, destroy, and a wrong
// token. Prints `RESULT {json}`.
import { Sandbox, RailwayGraphQLError } from 'railway';

const options = {
  endpoint: process.env.STAND_IN_URL,
  token: process.env.STAND_IN_TOKEN,
  environmentId: process.env.STAND_IN_ENV,
};

const result = {};
const sandbox = await Sandbox.create({ ...options, env: { GREETING: 'hi' }, idleTimeoutMinutes: 7, region: 'us-east4' });
result.id = sandbox.id;
result.status = sandbox.status;
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
