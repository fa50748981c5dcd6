// The official @kubernetes/client-node, unchanged, against the project's Kubernetes API server
// stand-in (spec/support/kube_service.lua), run by spec/providers/kubernetes_stand_in_spec.lua.
//
// STAND_IN_SERVER, STAND_IN_CA (the CA's PEM file), STAND_IN_TOKEN and STAND_IN_NAMESPACE make
// the client's configuration (KubeConfig.loadFromOptions, as a kubeconfig would). A Watch on the
// pods of a label; createNamespacedPod (its first phase: Pending), readNamespacedPod until it
// runs, listNamespacedPod with labelSelector; Exec (output, exit status, standard input closed
// by v5's close), Attach (a line to the pod's first process and its answer), PortForward (an
// HTTP server in the pod, reached through a local socket); createNamespacedNetworkPolicy;
// CustomObjectsApi for a SandboxTemplate, a SandboxWarmPool and a SandboxClaim (its Sandbox
// and Pod made, deleted with it); deleteNamespacedPod, then 404; refusals (a bad label: 422; a
// wrong token: 401). Prints `RESULT {json}`. The client is pinned at 1.4.0 in package.json: its
// 2.x line needs undici 8, which needs Node 22.19 or later, newer than the Node the project's
// Debian gives.
import net from 'node:net';
import http from 'node:http';
import { PassThrough } from 'node:stream';
import {
  Attach, CoreV1Api, CustomObjectsApi, Exec, KubeConfig, NetworkingV1Api, PortForward, Watch,
} from '@kubernetes/client-node';

const namespace = process.env.STAND_IN_NAMESPACE;
function config(token) {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'stand-in', server: process.env.STAND_IN_SERVER, caFile: process.env.STAND_IN_CA }],
    users: [{ name: 'u', token }],
    contexts: [{ name: 'c', cluster: 'stand-in', user: 'u', namespace }],
    currentContext: 'c',
  });
  return kc;
}
const kc = config(process.env.STAND_IN_TOKEN);
const core = kc.makeApiClient(CoreV1Api);
const result = {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(what, fn, ms = 15000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

function collect() {
  const s = new PassThrough();
  s.text = '';
  s.on('data', (d) => { s.text += d.toString(); });
  return s;
}

async function refusal(fn) {
  try {
    await fn();
    return null;
  } catch (e) {
    return { code: e.code, body: typeof e.body === 'string' ? JSON.parse(e.body) : e.body };
  }
}

const pod = (name, command, extra = {}) => ({
  apiVersion: 'v1', kind: 'Pod',
  metadata: { name, labels: { app: 'sdk', which: name } },
  spec: {
    restartPolicy: 'Never',
    containers: [{ name: 'sandbox', image: 'busybox:1', imagePullPolicy: 'IfNotPresent', command, ...extra }],
  },
});

const aborter = await new Watch(kc).watch(`/api/v1/namespaces/${namespace}/pods`, { labelSelector: 'app=sdk' },
  (type, obj) => {
    result.watch = result.watch ?? [];
    result.watch.push(`${type} ${obj.metadata.name} ${obj.status?.phase ?? ''}`);
  }, () => {});

try {
  // a pod whose first process answers lines on its standard input
  const created = await core.createNamespacedPod({ namespace, body: pod('sdk-main',
    ['sh', '-c', 'while read l; do echo "got $l"; done; echo bye'], { stdin: true }) });
  result.created_phase = created.status?.phase;
  result.created_rv = created.metadata.resourceVersion;
  const running = await until('running', async () => {
    const p = await core.readNamespacedPod({ name: 'sdk-main', namespace });
    return p.status?.phase === 'Running' ? p : null;
  });
  result.conditions = running.status.conditions.map((c) => `${c.type}=${c.status}`).sort();
  const listed = await core.listNamespacedPod({ namespace, labelSelector: 'app=sdk,which in (sdk-main)' });
  result.listed = listed.items.map((p) => p.metadata.name);
  const none = await core.listNamespacedPod({ namespace, labelSelector: 'app!=sdk' });
  result.listed_other = none.items.length;

  // exec: output, the exit status
  const out = collect();
  const err = collect();
  let status = null;
  const ws = await new Exec(kc).exec(namespace, 'sdk-main', 'sandbox',
    ['sh', '-c', 'echo out; echo err >&2; exit 3'], out, err, null, false, (s) => { status = s; });
  result.exec_protocol = ws.protocol;
  await until('exec status', async () => status);
  result.exec = { stdout: out.text, stderr: err.text, status: status.status, reason: status.reason,
    exit: status.details?.causes?.[0]?.message };

  // exec with standard input, closed by the v5 close message
  const inOut = collect();
  let inStatus = null;
  const input = new PassThrough();
  await new Exec(kc).exec(namespace, 'sdk-main', 'sandbox', ['cat'], inOut, null, input, false,
    (s) => { inStatus = s; });
  input.write('first\n');
  input.end('second\n');
  await until('exec stdin status', async () => inStatus);
  result.exec_stdin = { stdout: inOut.text, status: inStatus.status };

  // attach to the first process
  const aOut = collect();
  const aIn = new PassThrough();
  const aws = await new Attach(kc).attach(namespace, 'sdk-main', 'sandbox', aOut, null, aIn, false);
  aIn.write('ping\n');
  await until('attach answer', async () => aOut.text.includes('got ping'));
  result.attach = aOut.text;
  aws.close();

  // port-forward to a server in a pod
  const web = pod('sdk-web', ['sh', '-c', 'mkdir -p /tmp/www && echo served > /tmp/www/index.html && ' +
    'exec busybox httpd -f -p 127.0.0.1:8080 -h /tmp/www'], { volumeMounts: [{ name: 'tmp', mountPath: '/tmp' }] });
  web.spec.volumes = [{ name: 'tmp', emptyDir: { sizeLimit: '16Mi' } }];
  await core.createNamespacedPod({ namespace, body: web });
  await until('web running', async () => (await core.readNamespacedPod({ name: 'sdk-web', namespace }))
    .status?.phase === 'Running');
  await sleep(300);
  const pf = new PortForward(kc);
  const server = net.createServer((socket) => { pf.portForward(namespace, 'sdk-web', [8080], socket, null, socket); });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  result.forwarded = await new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: server.address().port, path: '/index.html' }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve(`${res.statusCode} ${body}`));
    }).on('error', reject);
  });
  server.close();

  // a NetworkPolicy: stored and returned
  const net1 = kc.makeApiClient(NetworkingV1Api);
  const np = await net1.createNamespacedNetworkPolicy({ namespace, body: {
    apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy',
    metadata: { name: 'sdk-deny', labels: { app: 'sdk' } },
    spec: { podSelector: { matchLabels: { app: 'sdk' } }, policyTypes: ['Ingress', 'Egress'] },
  } });
  result.netpol = np.spec.policyTypes;
  result.netpol_read = (await net1.readNamespacedNetworkPolicy({ name: 'sdk-deny', namespace })).metadata.name;

  // the Agent Sandbox resources
  const custom = kc.makeApiClient(CustomObjectsApi);
  const X = 'extensions.agents.x-k8s.io';
  await custom.createNamespacedCustomObject({ group: X, version: 'v1beta1', namespace, plural: 'sandboxtemplates',
    body: { apiVersion: `${X}/v1beta1`, kind: 'SandboxTemplate', metadata: { name: 'sdk-tpl' },
      spec: { podTemplate: { metadata: { labels: { app: 'sdk-claimed' } }, spec: { restartPolicy: 'Never',
        containers: [{ name: 'sandbox', image: 'busybox:1', command: ['sleep', '60'] }] } } } } });
  await custom.createNamespacedCustomObject({ group: X, version: 'v1beta1', namespace, plural: 'sandboxwarmpools',
    body: { apiVersion: `${X}/v1beta1`, kind: 'SandboxWarmPool', metadata: { name: 'sdk-pool' },
      spec: { replicas: 1, sandboxTemplateRef: { name: 'sdk-tpl' } } } });
  await custom.createNamespacedCustomObject({ group: X, version: 'v1beta1', namespace, plural: 'sandboxclaims',
    body: { apiVersion: `${X}/v1beta1`, kind: 'SandboxClaim', metadata: { name: 'sdk-claim' },
      spec: { warmPoolRef: { name: 'sdk-pool' } } } });
  const claim = await until('claim ready', async () => {
    const c = await custom.getNamespacedCustomObject({ group: X, version: 'v1beta1', namespace,
      plural: 'sandboxclaims', name: 'sdk-claim' });
    return c.status?.conditions?.some((x) => x.type === 'Ready' && x.status === 'True') ? c : null;
  });
  const sbName = claim.status.sandbox.name;
  const sb = await custom.getNamespacedCustomObject({ group: 'agents.x-k8s.io', version: 'v1beta1', namespace,
    plural: 'sandboxes', name: sbName });
  result.claim = { kind: claim.kind, sandbox_kind: sb.kind, pod_phase: (await core.readNamespacedPod(
    { name: sbName, namespace })).status.phase };
  await custom.deleteNamespacedCustomObject({ group: X, version: 'v1beta1', namespace, plural: 'sandboxclaims',
    name: 'sdk-claim' });
  result.claim_pod_gone = (await refusal(() => core.readNamespacedPod({ name: sbName, namespace })))?.code;

  // delete, then 404
  await core.deleteNamespacedPod({ name: 'sdk-main', namespace, gracePeriodSeconds: 0 });
  await core.deleteNamespacedPod({ name: 'sdk-web', namespace, gracePeriodSeconds: 0 });
  result.after_delete = (await refusal(() => core.readNamespacedPod({ name: 'sdk-main', namespace })))?.code;

  // refusals
  const bad = await refusal(() => core.createNamespacedPod({ namespace, body: {
    metadata: { name: 'sdk-bad', labels: { 'bad key!': 'x' } },
    spec: { containers: [{ name: 'sandbox', image: 'busybox:1' }] } } }));
  result.bad_label = { code: bad?.code, reason: bad?.body?.reason, kind: bad?.body?.kind };
  const wrong = await refusal(() => config('not-the-token').makeApiClient(CoreV1Api)
    .listNamespacedPod({ namespace }));
  result.wrong_token = { code: wrong?.code, reason: wrong?.body?.reason };
  await sleep(200);
} catch (e) {
  result.error = String(e?.stack ?? e);
} finally {
  aborter.abort();
}
console.log(`RESULT ${JSON.stringify(result)}`);
process.exit(0);
