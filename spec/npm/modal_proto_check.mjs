// Checks the project's proto/modal/*.proto against the messages the official `modal` SDK (0.11.1)
// is built from, run by spec/providers/modal_spec.lua: for every field of every message of ours,
// the SDK's generated encoder for the message of that name must write the field of that name
// (camelCase, as the SDK's generator names it) under the same number, wire type and kind (string,
// bytes, bool, int32 or enum, uint32, uint64, int64, float, double, or the same message type).
// Every method of our two services must be one of the SDK's service of that name, with the same
// request and response messages and streaming. The SDK's encoders and service definitions are
// read from its built file (dist/index.js), nothing of it is copied.
// Prints `RESULT {"messages":n,"fields":n,"methods":n,"mismatches":[...]}`.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const protobuf = require('protobufjs');
const PROTO_DIR = fileURLToPath(new URL('../../proto/', import.meta.url));
const SDK = fs.readFileSync(require.resolve('modal').replace(/index\.c?js$/, 'index.js'), 'utf8');

const root = new protobuf.Root();
root.resolvePath = (_, target) => `${PROTO_DIR}${target}`;
root.loadSync(['modal/api.proto', 'modal/task_command_router.proto'], { keepCase: true });
root.resolveAll();

// The SDK's encoder of message `name`: field name -> { tag, how } where `how` is the writer's
// method (string, int32, ...) or `msg:<Type>` for a nested message.
function sdkFields(name) {
  const start = SDK.indexOf(`\nvar ${name} = {\n`);
  if (start < 0) return null;
  const enc = SDK.indexOf('encode(message, writer', start);
  const end = SDK.indexOf('return writer;', enc);
  const body = SDK.slice(enc, end);
  const out = {};
  let loopField = null;
  for (const line of body.split('\n')) {
    const loop = /for \(const v of message\.(\w+)\)|Object\.entries\(message\.(\w+)\)/.exec(line);
    if (loop) loopField = loop[1] ?? loop[2];
    const tag = /writer\.uint32\((\d+)\)/.exec(line);
    if (!tag) continue;
    const enc = /\.encode\(message\.(\w+)/.exec(line);
    const val = /\.\w+\(message\.(\w+)\)/.exec(line);
    const field = enc ? enc[1] : val ? val[1] : loopField;
    const nested = /(\w+)\.encode\(/.exec(line);
    const method = /writer\.uint32\(\d+\)\.(\w+)\(/.exec(line);
    out[field] = { tag: Number(tag[1]), how: nested ? `msg:${nested[1]}` : method ? method[1] : '?' };
  }
  return out;
}

const camel = (s) => s.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
const WIRE = { string: 2, bytes: 2, bool: 0, int32: 0, uint32: 0, uint64: 0, int64: 0, float: 5, double: 1 };

const mismatches = [];
let messages = 0;
let fields = 0;
function visit(ns) {
  for (const obj of ns.nestedArray) {
    if (obj instanceof protobuf.Type) {
      if (obj.name.endsWith('Entry') && obj.options?.map_entry) continue;
      const sdkName = obj.parent instanceof protobuf.Type ? `${obj.parent.name}_${obj.name}` : obj.name;
      const got = sdkFields(sdkName);
      messages++;
      if (!got) { mismatches.push(`${obj.fullName}: the SDK has no message ${sdkName}`); continue; }
      for (const f of obj.fieldsArray) {
        fields++;
        const g = got[camel(f.name)];
        const where = `${obj.fullName}.${f.name}`;
        if (!g) { mismatches.push(`${where}: the SDK writes no field ${camel(f.name)}`); continue; }
        if (g.tag >> 3 !== f.id) mismatches.push(`${where}: number ${f.id}, the SDK's ${g.tag >> 3}`);
        let want;
        if (f.map) want = `msg:${sdkName}_${f.name.replace(/(^|_)([a-z])/g, (_, __, c) => c.toUpperCase())}Entry`;
        else if (f.resolvedType instanceof protobuf.Type) {
          const t = f.resolvedType;
          want = `msg:${t.parent instanceof protobuf.Type ? `${t.parent.name}_${t.name}` : t.name}`;
        } else if (f.resolvedType instanceof protobuf.Enum) want = 'int32';
        else want = f.type;
        if (g.how !== want) mismatches.push(`${where}: ${want}, the SDK's ${g.how}`);
        const wire = want.startsWith('msg:') ? 2 : (f.repeated && WIRE[want] !== 2 ? null : WIRE[want]);
        if (wire != null && (g.tag & 7) !== wire) mismatches.push(`${where}: wire type ${wire}, the SDK's ${g.tag & 7}`);
      }
    }
    if (obj.nestedArray) visit(obj);
  }
}
visit(root);

// Every method of our services: in the SDK's definition of the service of that full name, with
// the same request and response messages and the same streaming.
let methods = 0;
for (const svc of [root.lookupService('modal.client.ModalClient'),
  root.lookupService('modal.task_command_router.TaskCommandRouter')]) {
  const at = SDK.indexOf(`fullName: "${svc.fullName.slice(1)}"`);
  const next = SDK.indexOf('fullName: "', at + 10);
  const defs = SDK.slice(at, next < 0 ? undefined : next);
  for (const m of svc.methodsArray) {
    methods++;
    const re = new RegExp(`name: "${m.name}",\\s*requestType: (\\w+),\\s*requestStream: (\\w+),\\s*`
      + 'responseType: (\\w+),\\s*responseStream: (\\w+)');
    const d = re.exec(defs);
    const where = `${svc.fullName}/${m.name}`;
    if (!d) { mismatches.push(`${where}: not a method of the SDK's service`); continue; }
    const [, req, reqStream, resp, respStream] = d;
    if (req !== m.resolvedRequestType.name) mismatches.push(`${where}: request ${m.resolvedRequestType.name}, the SDK's ${req}`);
    if (resp !== m.resolvedResponseType.name) mismatches.push(`${where}: response ${m.resolvedResponseType.name}, the SDK's ${resp}`);
    if ((reqStream === 'true') !== Boolean(m.requestStream)) mismatches.push(`${where}: request streaming differs`);
    if ((respStream === 'true') !== Boolean(m.responseStream)) mismatches.push(`${where}: response streaming differs`);
  }
}
console.log(`RESULT ${JSON.stringify({ messages, fields, methods, mismatches })}`);
