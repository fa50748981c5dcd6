--- examples/kubernetes_kubeconfig.lua: the options of mayura.sandbox.kubernetes from a kubeconfig.
--
-- The library reads no environment variable and no file it was not named; this example does
-- it for you: `kubectl config view --raw --minify -o json` (kubectl reads KUBECONFIG, or
-- ~/.kube/config) gives the current context's cluster and user, and the data fields a kubeconfig
-- may carry inline (certificate-authority-data, client-certificate-data, client-key-data) are
-- written to files of a private directory (0700, the files 0600) whose paths go to the provider.
-- A user whose credentials come from an `exec` plugin (EKS, GKE, AKS) or an auth provider is
-- refused here: ask that plugin for a token and pass it as `token`.
--
--   local kubeconfig = dofile('examples/kubernetes_kubeconfig.lua')
--   local options, cleanup = kubeconfig.options({ agent_image = 'registry.example/mayura-agent:1' })
--   local provider = require('mayura.sandbox.kubernetes').kubernetes_sandboxes(options)
--   ...
--   cleanup()   -- removes the files written
--
-- Run on its own (`build/mayura examples/kubernetes_kubeconfig.lua`), it prints the options it
-- found, without the token or the keys.
local process = require('mayura.process')
local core = require('mayura.core')

local M = {}

-- The private directory of the files written (made at the first one), and its files.
local dir
local function b64_file(name, data)
  local bytes = core.base64.decode(data)
  if not dir then
    local mk = assert(io.popen('umask 077 && mktemp -d'))
    dir = mk:read('l')
    mk:close()
  end
  local path = dir .. '/' .. name
  local f = assert(io.open(path, 'wb'))
  f:write(bytes)
  f:close()
  return path
end

local function by_name(list, name)
  for _, e in ipairs(type(list) == 'table' and list or {}) do
    if type(e) == 'table' and e.name == name then return e end
  end
end

--- The provider's options from the current context, over `extra` (image, agent_image, ...);
-- returns them and a function removing the files written.
function M.options(extra)
  local r = process.run({ 'kubectl', 'config', 'view', '--raw', '--minify', '-o', 'json' }, { timeout_ms = 30000 })
  if r.exit_code ~= 0 then error('kubectl config view failed: is kubectl installed and a context set?', 0) end
  local config = core.json.decode(r.stdout)
  local context = by_name(config.contexts, config['current-context'])
  context = context and context.context or {}
  local cluster = (by_name(config.clusters, context.cluster) or {}).cluster or {}
  local user = (by_name(config.users, context.user) or {}).user or {}
  if user.exec or user['auth-provider'] then
    error('this kubeconfig user gets its credentials from a plugin: pass its token as `token`', 0)
  end
  local o = { server = cluster.server, namespace = context.namespace }
  if cluster['certificate-authority-data'] then
    o.ca_data = core.base64.decode(cluster['certificate-authority-data'])   -- PEM text: no file needed
  else
    o.ca_file = cluster['certificate-authority']
  end
  if user.token then
    o.token = user.token
  elseif user.tokenFile then
    local f = assert(io.open(user.tokenFile))
    o.token = f:read('a'):match('^%s*(.-)%s*$')
    f:close()
  end
  if user['client-certificate-data'] then
    o.client_cert = b64_file('client.pem', user['client-certificate-data'])
    o.client_key = b64_file('client-key.pem', user['client-key-data'])
  elseif user['client-certificate'] then
    o.client_cert, o.client_key = user['client-certificate'], user['client-key']
  end
  for k, v in pairs(extra or {}) do o[k] = v end
  local function cleanup()
    if not dir then return end
    for _, name in ipairs({ 'client.pem', 'client-key.pem' }) do os.remove(dir .. '/' .. name) end
    os.remove(dir)
    dir = nil
  end
  return o, cleanup
end

if arg and arg[0] and arg[0]:match('kubernetes_kubeconfig%.lua$') then
  local o, cleanup = M.options()
  for _, k in ipairs({ 'server', 'namespace', 'ca_file', 'client_cert' }) do
    print(('%-12s %s'):format(k, tostring(o[k])))
  end
  print(('%-12s %s'):format('ca_data', o.ca_data and '(set)' or 'nil'))
  print(('%-12s %s'):format('token', o.token and '(set)' or 'nil'))
  cleanup()
end

return M
