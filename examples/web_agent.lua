--- A web agent whose sandbox is online only as far as its allow-list: the network allow-list end to end.
--
--   build/mayura examples/web_agent.lua [--provider local|docker]
--
-- The agent gets a task: install a package from a registry, make a page with
-- it, serve the page on a port and give its URL. Its sandbox (made the first
-- time one of its tools needs it) is created with `network = { allow = {
-- 'packages.example.com' } }`: it has no route and no resolver of its own,
-- only an egress proxy that admits that one name (HTTP_PROXY is set for its
-- commands); anything else it asks for is refused, and each refusal comes to
-- the pool's `on_event`, which this script prints. Once the run is over, this
-- script reads the page back from the URL the agent gave (`sandbox:url(8080)`
-- through the tool `workspace.url`) and checks it, with no model involved.
--
-- Offline and recorded: "packages.example.com" is a registry stand-in, an
-- HTTP server on this machine's loopback serving greet-1.0.0.tgz, and the
-- provider's `proxy_resolve` (a resolver override meant for tests) points
-- the name at it; against a real registry, leave `proxy_resolve` out and the
-- proxy resolves names itself. The model is the scripted model playing
-- examples/sessions/web_page.lua; the sandbox, its proxy, the tools and the
-- permissions are real.
--
-- Sandboxes: the local provider by default (root is needed for an
-- allow-list); `--provider docker` uses mayura-test/busybox:1.
--
-- Exits 0 only when the page read back is the one the package renders; 1 otherwise; 2 for a
-- wrong command line or a provider without allow-lists here.
local mayura = require('mayura')
local sandbox = require('mayura.sandbox')
local http = require('mayura.http')
local uv = require('luv')

local z = mayura.z

io.stdout:setvbuf('line')

local function here()
  local dir = (arg and arg[0] or ''):match('^(.*)/[^/]*$')
  return dir or '.'
end

local function usage_error(message)
  io.stderr:write('web_agent: ', message, '\n',
    'usage: build/mayura examples/web_agent.lua [--provider local|docker]\n')
  os.exit(2)
end

local provider_name = 'local'
if arg and arg[1] == '--provider' and (arg[2] == 'local' or arg[2] == 'docker') and arg[3] == nil then
  provider_name = arg[2]
elseif arg and arg[1] ~= nil then
  usage_error('unknown arguments')
end

local session = assert(loadfile(here() .. '/sessions/web_page.lua', 't'))()
local model = require('mayura.testing').scripted_model(session.steps, { max_cost_micros = 40000 })

-- {======================================================
-- The registry stand-in: one tarball over HTTP on 127.0.0.1
-- =======================================================

-- the package's tarball, made with tar(1) from the session's files
local function make_tarball(files)
  local process = require('mayura.process')
  local dir = assert(process.run({ 'mktemp', '-d' }).stdout:match('%S+'))
  for _, f in ipairs(files) do
    local path = dir .. '/' .. f.name
    process.run({ 'mkdir', '-p', (path:match('^(.*)/')) })
    local fh = assert(io.open(path, 'wb'))
    fh:write(f.data)
    fh:close()
    if f.mode then process.run({ 'chmod', ('%o'):format(f.mode), path }) end
  end
  local r = process.run({ 'tar', '-czf', '-', '-C', dir, 'greet' }, { max_output_bytes = 1048576 })
  process.run({ 'rm', '-rf', dir })
  assert(r.exit_code == 0, 'tar: ' .. r.stderr)
  return r.stdout
end
local tarball = make_tarball(session.package)
local registry = uv.new_tcp()
assert(registry:bind('127.0.0.1', 0))
local registry_port = registry:getsockname().port
local fetched = 0
registry:listen(16, function()
  local client = uv.new_tcp()
  registry:accept(client)
  local head = ''
  client:read_start(function(err, chunk)
    if err or not chunk then client:close(); return end
    head = head .. chunk
    if not head:find('\r\n\r\n', 1, true) then return end
    client:read_stop()
    local path = head:match('^GET (/%S*) HTTP')
    local status, body = '404 Not Found', 'no such package\n'
    if path == '/greet-1.0.0.tgz' then
      status, body = '200 OK', tarball
      fetched = fetched + 1
    end
    client:write(('HTTP/1.1 %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n'):format(status, #body) .. body,
      function() client:close() end)
  end)
end)

-- {======================================================
-- 1. A pool of sandboxes that may be online through an allow-list
-- =======================================================

local resolve = { [session.registry] = '127.0.0.1:' .. registry_port }   -- the stand-in; leave out for real
local provider
if provider_name == 'docker' then
  provider = require('mayura.sandbox.docker').docker_sandboxes({ image = 'mayura-test/busybox:1',
    proxy_resolve = resolve })
else
  provider = require('mayura.sandbox.local').local_sandboxes({ proxy_resolve = resolve })
end
local can = false
for _, kind in ipairs(provider.features.network) do can = can or kind == 'allowlist' end
if not can then usage_error('the ' .. provider_name .. ' provider offers no network allow-list here (run as root)') end

local refusals = {}
local sandboxes = sandbox.create_sandboxes(provider, {
  max_sandboxes = 2,
  max_lifetime_ms = 10 * 60000,
  network = { 'none', 'allowlist' },     -- offline, or online through an allow-list; never 'all'
  on_event = function(event)
    if event.type == 'network_refused' then
      refusals[#refusals + 1] = event
      print(string.format('      network: %s refused %s:%s (%s)', event.sandbox, tostring(event.host),
        tostring(event.port), event.reason))
    end
  end,
})

local per_run = sandbox.sandbox_per_run(sandboxes, function(ctx)
  return { lifetime_ms = 5 * 60000, labels = { run = ctx.run_id }, ports = { 8080 },
    network = { allow = { session.registry } } }
end)

local tools = sandbox.sandbox_tools(per_run.source, {
  name = 'workspace', exec = true, write = true, ports = true, exec_timeout_ms = 60000,
})

-- {======================================================
-- 2. The agent, its permissions and limits
-- =======================================================

local agent = mayura.define_agent({
  id = 'web', version = '1', tools = tools, model = model,
  input = z.object({ task = z.string():max(4000) }),
  output = z.object({ summary = z.string():max(2000), url = z.string():max(200) }),
  instructions = {
    'You work in the workspace sandbox, a Linux machine whose network reaches only the names it was allowed.',
    'Fetch with wget or curl: they use the proxy the sandbox is given. Answer with a summary and the page\'s URL.',
  },
})

local runtime = mayura.create_runtime({
  profile = 'ephemeral',
  permissions = {
    allow = {
      'model:' .. model.id,
      'tool:workspace.read', 'tool:workspace.list', 'sandbox:workspace:read', 'effect:read',
      'tool:workspace.write', 'tool:workspace.remove', 'sandbox:workspace:write',
      'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write',
      'tool:workspace.url', 'sandbox:workspace:ports',
    },
  },
  limits = { max_steps = 12, max_model_calls = 12, max_tool_calls = 12, max_duration_ms = 120000,
    max_cost_micros = 200000 },
})

-- {======================================================
-- 3. Run it, then read the page back without the model
-- =======================================================

local function on_event(event)
  if event.type == 'tool_call_started' then
    local input = type(event.input) == 'table' and event.input or {}
    print('  ' .. event.tool_id .. (input.command and (' $ ' .. input.command) or input.port and
      (' port ' .. input.port) or ''))
  elseif event.type == 'tool_call_ended' then
    print('      -> ' .. (event.exit_code ~= nil and ('exit ' .. event.exit_code) or tostring(event.summary)))
  end
end

print('Task: ' .. session.task)
print(string.format('Sandboxes: %s, network { allow = { %q } } through an egress proxy; the registry is a'
  .. ' stand-in on 127.0.0.1:%d, and the model plays a recorded session.', provider_name, session.registry,
  registry_port))

local run = runtime:submit(agent, { input = { task = session.task }, on_event = on_event })
local outcome = run:result()
runtime:close()

local exit_code = 1
if outcome.status ~= 'succeeded' then
  print(string.format('The run ended %s with %s: %s', outcome.status, tostring(outcome.error.code),
    tostring(outcome.error.message)))
else
  local url = outcome.output.url
  print('Summary: ' .. outcome.output.summary)
  print('URL: ' .. url)
  local ok, res = pcall(http.request, { url = url .. '/index.html', timeout_ms = 10000 })
  local want = session.package[2].data:gsub('@NAME@', 'visitor')
  if ok and res.status == 200 and res.body == want then
    print('Read back: ' .. (res.body:match('<h1>(.-)</h1>') or ''))
    print(string.format('Verdict: the page is the package\'s (%d download from the registry, %d refusal%s).',
      fetched, #refusals, #refusals == 1 and '' or 's'))
    exit_code = 0
  else
    print('Verdict: the page could not be read back: ' .. (ok and ('HTTP ' .. res.status) or tostring(res)))
  end
end

sandboxes:close()
registry:close()
os.exit(exit_code)
