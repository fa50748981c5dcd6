// The official @kubernetes/client-node's side of bench/kubernetes.lua: against the API server
// stand-in the Lua side serves (STAND_IN_SERVER, STAND_IN_CA, STAND_IN_TOKEN, STAND_IN_NAMESPACE),
// the median time to a first command (a NetworkPolicy and a locked-down Pod made as mayura makes
// them, the Pod read every 50 ms until its container runs, then `true` through Exec over
// WebSocket; the deletes after it are not timed) and of Exec `true` in one Pod
// (bench/_sdk_timing.mjs). Prints `RESULT {"first_ms":..,"exec_ms":..}`.
import { pathToFileURL } from 'node:url';
import { firstAndExec } from './_sdk_timing.mjs';

const { CoreV1Api, Exec, KubeConfig, NetworkingV1Api } = await import(
  pathToFileURL(`${process.cwd()}/spec/npm/node_modules/@kubernetes/client-node/dist/index.js`).href);

const namespace = process.env.STAND_IN_NAMESPACE;
const kc = new KubeConfig();
kc.loadFromOptions({
  clusters: [{ name: 'stand-in', server: process.env.STAND_IN_SERVER, caFile: process.env.STAND_IN_CA }],
  users: [{ name: 'bench', token: process.env.STAND_IN_TOKEN }],
  contexts: [{ name: 'bench', cluster: 'stand-in', user: 'bench', namespace }],
  currentContext: 'bench',
});
const core = kc.makeApiClient(CoreV1Api);
const net = kc.makeApiClient(NetworkingV1Api);
const exec = new Exec(kc);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const hardened = { runAsUser: 1300000, runAsGroup: 1300000, runAsNonRoot: true, allowPrivilegeEscalation: false,
  readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] }, seccompProfile: { type: 'RuntimeDefault' } };

let seq = 0;
async function open() {
  seq += 1;
  const name = `sdk-bench-${process.pid}-${seq}`;
  const labels = { 'sdk-bench': name };
  await net.createNamespacedNetworkPolicy({ namespace, body: { apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy', metadata: { name, labels },
    spec: { podSelector: { matchLabels: labels }, policyTypes: ['Ingress', 'Egress'], ingress: [], egress: [] } } });
  await core.createNamespacedPod({ namespace, body: { apiVersion: 'v1', kind: 'Pod', metadata: { name, labels },
    spec: {
      restartPolicy: 'Never', activeDeadlineSeconds: 600, terminationGracePeriodSeconds: 0,
      automountServiceAccountToken: false, enableServiceLinks: false,
      containers: [{ name: 'sandbox', image: 'busybox:1', imagePullPolicy: 'IfNotPresent', command: ['sleep', '600'],
        securityContext: hardened, workingDir: '/workspace',
        resources: { limits: { cpu: '1', memory: '64Mi' }, requests: { cpu: '1', memory: '64Mi' } },
        volumeMounts: [{ name: 'workdir', mountPath: '/workspace' }] }],
      volumes: [{ name: 'workdir', emptyDir: { medium: 'Memory', sizeLimit: '64Mi' } }],
    } } });
  for (;;) {
    const p = await core.readNamespacedPod({ name, namespace });
    if (p.status?.containerStatuses?.[0]?.state?.running) return name;
    await sleep(50);
  }
}

await firstAndExec({
  open,
  exec: (name) => new Promise((resolve, reject) => {
    exec.exec(namespace, name, 'sandbox', ['true'], null, null, null, false, (s) => {
      if (s.status === 'Success') resolve(); else reject(new Error(`true failed: ${JSON.stringify(s)}`));
    }).catch(reject);
  }),
  close: async (name) => {
    await core.deleteNamespacedPod({ name, namespace, gracePeriodSeconds: 0 });
    await net.deleteNamespacedNetworkPolicy({ name, namespace });
  },
});
