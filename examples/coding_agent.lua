--- A coding agent that writes and runs code in a sandbox: the coding-agent guide end to end.
--
--   build/mayura examples/coding_agent.lua [--provider NAME] [TASK...]
--   NAME: local, docker, e2b, vercel, daytona, fly, cloudflare, agentcore,
--         apple-container, railway, northflank, codesandbox or modal
--         (mayura.sandbox's provider of that name, '-' as '_': sandbox.provider(name, options),
--         with the options its entry in PROVIDERS below makes from the environment)
--
-- The agent gets a task, writes files in a sandbox of its own (made the first
-- time one of its tools needs it, released when the run ends), runs
-- `node --test`, reads the output and edits until the tests pass or its
-- limits stop it, then answers with a summary and its files. This script then
-- runs the tests again on the returned files in a fresh sandbox, with a fixed
-- command and no model: the agent's claim that they pass does not count.
--
-- The model: with OPENAI_API_KEY and OPENAI_MODEL set, that model
-- (OPENAI_BASE_URL for a compatible server; with it, OPENAI_API=chat uses the
-- Chat Completions API instead of Responses). Without a key, the scripted
-- model plays the recorded session of examples/sessions/slugify.lua; the
-- sandbox, the tools, the permissions and the budget are real either way.
--
-- Sandboxes: the local provider (bubblewrap namespaces over the host's /usr,
-- so the host's Node.js is inside) by default; `--provider docker` uses the
-- Docker image mayura-test/node:1 (built offline by scripts/docker-setup.sh);
-- `--provider e2b` runs them on E2B, with the same code (the guide's "Go to
-- production on E2B"): the key from E2B_API_KEY (read here, never by the
-- library), the template from E2B_TEMPLATE ('base'; it needs Node.js), and,
-- for a self-hosted E2B or a stand-in, E2B_DOMAIN, E2B_API_URL,
-- E2B_SANDBOX_URL and E2B_WORKDIR (the template's working directory).
-- `--provider vercel` uses Vercel Sandbox with the token in VERCEL_TOKEN and
-- the team and project in VERCEL_TEAM_ID and VERCEL_PROJECT_ID (this script
-- reads them; the provider never reads the environment). VERCEL_API_URL and
-- VERCEL_WORKDIR point it at a service speaking the same API elsewhere, as
-- the specs' stand-in does.
-- `--provider daytona` uses Daytona's default snapshot, with the key from
-- DAYTONA_API_KEY (read here: the library never reads the environment) and
-- DAYTONA_API_URL for another API than Daytona's own (the specs' stand-in).
-- `--provider fly` uses Fly Machines in the app FLY_APP with the token in
-- FLY_API_TOKEN (FLY_IMAGE: an image with Node.js; FLY_API_URL for another
-- API). `--provider cloudflare` goes through your sandbox bridge Worker at
-- CLOUDFLARE_SANDBOX_URL with the key in CLOUDFLARE_SANDBOX_API_KEY.
-- `--provider agentcore` uses AgentCore Code Interpreter sessions in
-- AWS_REGION with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
-- AWS_SESSION_TOKEN (read here, never by the library; AGENTCORE_ENDPOINT for
-- another endpoint). These three cannot keep a sandbox off the network, so
-- their pools hand out network 'all'. `--provider apple-container` uses Apple
-- `container` VMs (CONTAINER_IMAGE, with Node.js; CONTAINER_CLI for another
-- executable than `container`).
-- `--provider railway` uses Railway sandboxes in the environment
-- RAILWAY_ENVIRONMENT_ID with the token in RAILWAY_API_TOKEN (read here);
-- RAILWAY_GRAPHQL_ENDPOINT, RAILWAY_TCP_PROXY_WS_ENDPOINT (its command bridge)
-- and RAILWAY_WORKDIR for a service speaking the same API elsewhere. Railway
-- sandboxes are always online (the service has no egress policy), so that
-- pool lists network 'all' and asks for it.
-- `--provider northflank` uses Northflank services in the project
-- NORTHFLANK_PROJECT_ID with the token in NORTHFLANK_API_TOKEN (read here);
-- NORTHFLANK_API_URL and NORTHFLANK_EXEC_URL for a service speaking the same
-- API elsewhere. Online as well (Northflank has no egress policy either).
-- `--provider codesandbox` uses CodeSandbox VMs forked from its universal
-- template with the token in CSB_API_KEY (read here); CSB_BASE_URL and
-- CSB_WORKDIR for a service speaking the same API elsewhere. Online as well
-- (CodeSandbox has no egress policy).
-- `--provider modal` uses Modal sandboxes with the token in MODAL_TOKEN_ID and
-- MODAL_TOKEN_SECRET (read here); MODAL_IMAGE (an image with Node.js,
-- node:22-bookworm-slim by default) and MODAL_SERVER_URL for a service speaking
-- the same gRPC API elsewhere. Modal keeps sandboxes offline: network 'none'.
-- `--provider kubernetes` makes each sandbox a Pod of the kubeconfig's current
-- context (examples/kubernetes_kubeconfig.lua: kubectl reads KUBECONFIG), in
-- KUBE_IMAGE (an image with Node.js, node:22-bookworm-slim by default), the
-- agent copied in from KUBE_AGENT_IMAGE (an image holding build/mayura-agent at
-- /mayura-agent and cp); a NetworkPolicy keeps each one offline.
--
-- With a policy file, the pool, the tools, the agent, its grants, limits and
-- budget come from it instead of sections 1 to 4 below (--provider is then
-- refused: the policy names its provider):
--
--   build/mayura --policy examples/policies/coding.lua examples/coding_agent.lua
--
-- Exits 0 only when the re-check passes; 1 when the run or the re-check
-- fails; 2 for a wrong command line or a missing OPENAI_MODEL.
local mayura = require('mayura')
local sandbox = require('mayura.sandbox')

local z = mayura.z

io.stdout:setvbuf('line')   -- progress shows as it happens, also through a pipe

local DEFAULT_TASK = 'Write slugify(text) in slugify.js: lowercase, words joined by "-", only a-z and 0-9 kept.'
  .. ' Test it in slugify.test.js.'
local EXEC_COST_MICROS = 2000

local function here()
  local dir = (arg and arg[0] or ''):match('^(.*)/[^/]*$')
  return dir or '.'
end

-- {======================================================
-- The providers --provider can name
-- =======================================================

-- For each: the environment variables it cannot do without (`needs`), and its options made from the
-- environment once it is chosen (`env(NAME)` is the variable NAME, nil when unset or empty). The
-- provider is then mayura.sandbox's by that name ('-' as '_'); the library itself reads no environment.
local PROVIDERS = {
  ['local'] = {},
  docker = { options = function() return { image = 'mayura-test/node:1' } end },
  e2b = { needs = { 'E2B_API_KEY' }, options = function(env) return {
    api_key = env('E2B_API_KEY'), template = env('E2B_TEMPLATE') or 'base',   -- an E2B template with Node.js
    -- these four only for a self-hosted E2B or a stand-in
    domain = env('E2B_DOMAIN'), api_url = env('E2B_API_URL'), sandbox_url = env('E2B_SANDBOX_URL'),
    workdir = env('E2B_WORKDIR'),
  } end },
  vercel = { needs = { 'VERCEL_TOKEN', 'VERCEL_TEAM_ID', 'VERCEL_PROJECT_ID' }, options = function(env) return {
    token = env('VERCEL_TOKEN'), team_id = env('VERCEL_TEAM_ID'), project_id = env('VERCEL_PROJECT_ID'),
    base_url = env('VERCEL_API_URL'), workdir = env('VERCEL_WORKDIR'),
  } end },
  daytona = { needs = { 'DAYTONA_API_KEY' }, options = function(env) return {
    api_key = env('DAYTONA_API_KEY'), base_url = env('DAYTONA_API_URL'),   -- nil: Daytona's own API
  } end },
  fly = { needs = { 'FLY_API_TOKEN', 'FLY_APP' }, options = function(env) return {
    token = env('FLY_API_TOKEN'), app = env('FLY_APP'), image = env('FLY_IMAGE'), base_url = env('FLY_API_URL'),
  } end },
  cloudflare = { needs = { 'CLOUDFLARE_SANDBOX_URL', 'CLOUDFLARE_SANDBOX_API_KEY' }, options = function(env) return {
    worker_url = env('CLOUDFLARE_SANDBOX_URL'), api_key = env('CLOUDFLARE_SANDBOX_API_KEY'),
  } end },
  agentcore = { needs = { 'AWS_REGION', 'AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY' }, options = function(env) return {
    region = env('AWS_REGION'), endpoint = env('AGENTCORE_ENDPOINT'),
    credentials = { access_key_id = env('AWS_ACCESS_KEY_ID'), secret_access_key = env('AWS_SECRET_ACCESS_KEY'),
      session_token = env('AWS_SESSION_TOKEN') },
  } end },
  ['apple-container'] = { options = function(env) return {
    image = env('CONTAINER_IMAGE'), executable = env('CONTAINER_CLI'),
  } end },
  railway = { needs = { 'RAILWAY_API_TOKEN', 'RAILWAY_ENVIRONMENT_ID' }, options = function(env) return {
    token = env('RAILWAY_API_TOKEN'), environment_id = env('RAILWAY_ENVIRONMENT_ID'),
    endpoint = env('RAILWAY_GRAPHQL_ENDPOINT'), ws_url = env('RAILWAY_TCP_PROXY_WS_ENDPOINT'),
    workdir = env('RAILWAY_WORKDIR'),
  } end },
  northflank = { needs = { 'NORTHFLANK_API_TOKEN', 'NORTHFLANK_PROJECT_ID' }, options = function(env) return {
    token = env('NORTHFLANK_API_TOKEN'), project_id = env('NORTHFLANK_PROJECT_ID'),
    api_url = env('NORTHFLANK_API_URL'), exec_url = env('NORTHFLANK_EXEC_URL'),
  } end },
  codesandbox = { needs = { 'CSB_API_KEY' }, options = function(env) return {
    token = env('CSB_API_KEY'), base_url = env('CSB_BASE_URL'), workdir = env('CSB_WORKDIR'),
  } end },
  modal = { needs = { 'MODAL_TOKEN_ID', 'MODAL_TOKEN_SECRET' }, options = function(env) return {
    token_id = env('MODAL_TOKEN_ID'), token_secret = env('MODAL_TOKEN_SECRET'),
    image = env('MODAL_IMAGE') or 'node:22-bookworm-slim', server_url = env('MODAL_SERVER_URL'),
  } end },
  -- the cluster and its credentials: the kubeconfig's current context, read by the example's helper
  kubernetes = { needs = { 'KUBE_AGENT_IMAGE' }, options = function(env)
    return dofile(here() .. '/kubernetes_kubeconfig.lua').options({
      image = env('KUBE_IMAGE') or 'node:22-bookworm-slim', agent_image = env('KUBE_AGENT_IMAGE'),
    })
  end },
}

-- 'a, b and c' (or `last`, for 'and')
local function listing(words, last)
  if #words < 2 then return words[1] or '' end
  return table.concat(words, ', ', 1, #words - 1) .. ' ' .. (last or 'and') .. ' ' .. words[#words]
end

local function provider_names()
  local names = {}
  for name in pairs(PROVIDERS) do names[#names + 1] = name end
  table.sort(names)
  return names
end

local function usage_error(message)
  io.stderr:write('coding_agent: ', message, '\n',
    'usage: build/mayura examples/coding_agent.lua [--provider NAME] [TASK...]\n',
    '  NAME: ', listing(provider_names(), 'or'), '\n')
  os.exit(2)
end

-- The last `n` lines of `text`, indented.
local function last_lines(text, n)
  local lines = {}
  for line in text:gmatch('[^\n]+') do
    lines[#lines + 1] = '    ' .. line
    if #lines > n then table.remove(lines, 1) end
  end
  return table.concat(lines, '\n')
end

local function dollars(micros)
  return string.format('$%.4f', micros / 1e6)
end

-- {======================================================
-- The command line
-- =======================================================

local provider_name, words = 'local', {}
do
  local i = 1
  while arg and arg[i] ~= nil do
    local a = arg[i]
    if a == '--provider' then
      provider_name = arg[i + 1]
      if not PROVIDERS[provider_name] then usage_error('--provider takes one of the names below') end
      i = i + 2
    elseif a:sub(1, 2) == '--' and #words == 0 then
      usage_error('unknown option ' .. a)
    else
      words[#words + 1] = a
      i = i + 1
    end
  end
end
local task_text = #words > 0 and table.concat(words, ' ') or DEFAULT_TASK
local policy = mayura.policy()   -- the policy of `build/mayura --policy FILE`, or nil
if policy and provider_name ~= 'local' then usage_error('--provider is the policy\'s to choose') end

-- {======================================================
-- The model: a real one with a key, else the recorded session
-- =======================================================

local api_key = os.getenv('OPENAI_API_KEY')
local model
if api_key and api_key ~= '' then
  local model_name = os.getenv('OPENAI_MODEL')
  if not model_name or model_name == '' then
    usage_error('OPENAI_API_KEY is set, so OPENAI_MODEL must name the model')
  end
  local base_url = os.getenv('OPENAI_BASE_URL')
  if base_url == '' then base_url = nil end
  local openai = require('mayura.provider.openai')   -- loaded only when a key is given
  local options = {
    api_key = api_key,
    model = model_name,
    base_url = base_url,
    max_cost_micros = 40000,   -- at most $0.04 per model call
    -- your model's prices: Mayura does not look them up
    pricing = { input_micros_per_million_tokens = 1250000, output_micros_per_million_tokens = 10000000 },
  }
  if base_url and os.getenv('OPENAI_API') == 'chat' then
    model = openai.openai_chat_completions(options)
  else
    model = openai.openai_responses(options)
  end
  print(string.format('mayura coding agent: model %s (%s)%s', model_name, model.id,
    base_url and (' at ' .. base_url) or ''))
else
  local session_path = here() .. '/sessions/slugify.lua'
  local session = assert(loadfile(session_path, 't'))()
  model = require('mayura.testing').scripted_model(session.steps, { max_cost_micros = 40000 })
  print('mayura coding agent: no OPENAI_API_KEY, so this plays a recorded session (' .. session_path
    .. ') through the scripted model; the sandboxes, tools, permissions and budget are real.')
  if #words > 0 then
    print('The recorded session answers its own task; the task given here is ignored.')
  end
  task_text = session.task
end

-- Sections 1 to 4 as code; with a policy, its environment does all of it (see the end).
local sandboxes, coder, runtime, policy_env
local network = 'none'   -- the sandboxes' network: 'none' unless the provider cannot keep them offline
if policy then
  policy_env = policy:open()
  sandboxes = policy_env:pool('workspace')
else

-- {======================================================
-- 1. A pool of sandboxes
-- =======================================================

local function setting(name)
  local v = os.getenv(name)
  if v == '' then return nil end
  return v
end

-- The chosen provider, by name, with its options from the environment.
local chosen = PROVIDERS[provider_name]
for _, name in ipairs(chosen.needs or {}) do
  if not setting(name) then usage_error('--provider ' .. provider_name .. ' needs ' .. listing(chosen.needs)) end
end
local provider = sandbox.provider((provider_name:gsub('-', '_')), chosen.options and chosen.options(setting))
-- A provider that cannot keep sandboxes off the network gets a pool of what it can give.
do
  local offline = false
  for _, k in ipairs(provider.features.network) do offline = offline or k == 'none' end
  if not offline then network = provider.features.network[1] end
end

sandboxes = sandbox.create_sandboxes(provider, {
  max_sandboxes = 4,                -- at most four alive at once; a fifth fails with LIMIT_EXCEEDED
  max_lifetime_ms = 30 * 60000,     -- no sandbox lives longer than 30 minutes
  max_exec_timeout_ms = 5 * 60000,
  network = { network },            -- { 'none' }: no sandbox of this pool reaches the network
})

-- {======================================================
-- 2. One sandbox per run
-- =======================================================

local per_run = sandbox.sandbox_per_run(sandboxes, function(ctx)
  return { lifetime_ms = 15 * 60000, labels = { run = ctx.run_id }, network = network }
end)

local tools = sandbox.sandbox_tools(per_run.source, {
  name = 'workspace',
  exec = true,                          -- workspace.exec: run shell commands
  write = true,                         -- workspace.write and workspace.remove
  exec_timeout_ms = 120000,             -- no command runs longer than 2 minutes
  exec_cost_micros = EXEC_COST_MICROS,  -- each command is charged $0.002 against the run's budget
})

local release_workspace = mayura.define_hook({
  id = 'workspace.release', version = '1', stage = 'on_finally', timeout_ms = 30000,
  handler = function(_, context) per_run.release(context.run_id) end,
})

-- {======================================================
-- 3. The agent
-- =======================================================

local task_schema = z.object({ task = z.string():max(4000) })
local result_schema = z.object({
  summary = z.string():max(2000),
  files = z.array(z.object({ path = z.string():max(200), content = z.string():max(50000) })):min(1):max(10),
})

coder = mayura.define_agent({
  id = 'coder', version = '1', input = task_schema, output = result_schema, tools = tools, model = model,
  hooks = { release_workspace },
  instructions = {
    'You write small JavaScript modules and their tests in the workspace sandbox, an isolated Linux machine'
      .. ' with Node.js.',
    'Write ES modules with the .js extension, and tests in files ending .test.js that use node:test and'
      .. ' node:assert.',
    'Run the tests with workspace.exec and the command "node --test". Read the output, fix the code, and run'
      .. ' them again until they pass.',
    (network ~= 'none' and 'Do not try to install packages'
      or 'The sandbox has no network: do not try to install packages') .. '; use only the Node.js standard library.',
    'Answer with a short summary and the final content of every file you wrote.',
  },
})

-- {======================================================
-- 4. Permissions and limits
-- =======================================================

runtime = mayura.create_runtime({
  profile = 'ephemeral',
  permissions = {
    allow = {
      'model:' .. model.id,   -- model:openai.responses with OpenAI, model:scripted for the recorded session
      -- Read and list files.
      'tool:workspace.read', 'tool:workspace.list', 'sandbox:workspace:read', 'effect:read',
      -- Write and remove files.
      'tool:workspace.write', 'tool:workspace.remove', 'sandbox:workspace:write',
      -- Run commands.
      'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write',
    },
  },
  limits = {
    max_steps = 24, max_model_calls = 24, max_tool_calls = 40,
    max_duration_ms = 10 * 60000,  -- the default is 60 seconds, too short for a write-test-fix loop
    max_cost_micros = 600000,      -- at most $0.60 per run, model calls and commands together
  },
})

end   -- of sections 1 to 4

-- {======================================================
-- Progress, from the run's events
-- =======================================================

local spent = 0   -- the run's cost so far, in micro-dollars

local function describe_call(event)
  local input = type(event.input) == 'table' and event.input or {}
  if event.tool_id == 'workspace.exec' then return '$ ' .. tostring(input.command) end
  if input.path then return event.tool_id .. ' ' .. tostring(input.path) end
  return event.tool_id
end

local pending = {}   -- call_id -> what the call was, until it ends
local calls = 0      -- the model call under way

local function on_event(event)
  local t = event.type
  if t == 'model_call_ended' then
    spent = event.total_cost_micros or spent
    local what = not event.ok and 'failed'
      or event.step_type == 'final' and 'final answer'
      or 'asked for tools'
    print(string.format('  model call %-3d %-16s %s   so far %s', calls, what,
      dollars(event.cost_micros or 0), dollars(spent)))
  elseif t == 'model_call_started' then
    calls = event.call or calls + 1
  elseif t == 'tool_call_started' then
    pending[event.call_id or ''] = describe_call(event)
  elseif t == 'tool_call_ended' then
    local what = pending[event.call_id or ''] or event.tool_id
    pending[event.call_id or ''] = nil
    -- a command is charged once it was let run, whatever came of it (not when its input was refused)
    local refused = tostring(event.summary):find('^error INVALID_INPUT') ~= nil
    if event.tool_id == 'workspace.exec' and not refused then
      spent = spent + EXEC_COST_MICROS
      local result = event.timed_out and 'timed out'
        or event.exit_code ~= nil and ('exit ' .. tostring(event.exit_code))
        or tostring(event.summary)
      print(string.format('      %s  -> %s   so far %s', what, result, dollars(spent)))
    else
      print(string.format('      %s  -> %s', what, event.ok and 'ok' or tostring(event.summary)))
    end
  elseif t == 'limit_reached' then
    print(string.format('  limit reached: %s (%s)', tostring(event.limit), tostring(event.value)))
  end
end

-- {======================================================
-- 6. Run it, and check the result yourself
-- =======================================================

--- Runs the tests on `files` in a fresh sandbox, with no model involved.
-- Returns whether they pass, and the command's result.
local function tests_pass(pool, files)
  local sb = pool:create({ lifetime_ms = 5 * 60000, network = network })
  local ok, res = pcall(function()
    for _, file in ipairs(files) do sb:write_file(file.path, file.content) end
    return sb:exec({ 'node', '--test' }, { timeout_ms = 60000 })
  end)
  sb:release()
  if not ok then error(res, 0) end
  return res.exit_code == 0, res
end

print('Task: ' .. task_text)
if policy then
  print('Policy: ' .. table.concat(policy.files, ', ') .. ' (pool, tools, agent, grants, limits and budget).')
else
  print('Sandboxes: ' .. provider_name .. (network == 'none' and ', no network' or ', network ' .. network
    .. ' (the service cannot keep it offline)') .. '; one per run, released when the run ends.')
end

local outcome
if policy then
  outcome = policy_env:run('coder', { task = task_text }, model, { on_event = on_event })
else
  local run = runtime:submit(coder, { input = { task = task_text }, on_event = on_event })
  outcome = run:result()
  runtime:close()
end

local usage = outcome.usage
print(string.format('Run %s: %d model calls, %d tool calls, %s, %.1f s.', outcome.status, usage.model_calls,
  usage.tool_calls, dollars(usage.cost_micros), (outcome.duration_ms or 0) / 1000))

local exit_code = 1
if outcome.status ~= 'succeeded' then
  print(string.format('The run ended %s with %s: %s', outcome.status, tostring(outcome.error.code),
    tostring(outcome.error.message)))
  print('Verdict: no files to check; the run did not succeed.')
else
  local output = outcome.output
  print('')
  print('Summary: ' .. output.summary)
  for _, file in ipairs(output.files) do
    print('')
    print(string.format('--- %s (%d bytes)', file.path, #file.content))
    io.write(file.content)
    if file.content:sub(-1) ~= '\n' then io.write('\n') end
  end
  print('')
  print('Re-check: node --test on the returned files in a fresh sandbox, no model involved...')
  local ok, passed, res = pcall(tests_pass, sandboxes, output.files)
  if not ok then
    print('Verdict: the re-check could not run (' .. tostring(passed) .. '): do not use these files.')
  elseif passed then
    print('Verdict: the re-check passed (node --test exited 0): the files can be used.')
    exit_code = 0
  else
    local why = res.timed_out and 'timed out' or ('exited ' .. tostring(res.exit_code))
    print(last_lines(res.stdout .. res.stderr, 20))
    print('Verdict: the re-check failed (node --test ' .. why .. '): do not use these files.')
  end
end

if policy_env then policy_env:close() else sandboxes:close() end
os.exit(exit_code)
