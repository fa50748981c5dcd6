-- The server scenarios of @modelcontextprotocol/conformance (pinned in spec/npm/package.json: 0.1.10,
-- the last release that runs on Node 20) against mayura.mcp.http in this process, serving the
-- specs' policy. Its client sends no token, so spec/npm/mcp_auth_fetch.mjs adds the bearer header.
-- The scenarios that pass are named; each other one fails for a reason docs/serve.md names: a
-- feature this server does not offer (logging, completion, resources, prompts: -32601) or a fixture
-- tool of the suite's own test server (test_simple_text, ...: -32602), which a policy does not have.
local core = require('mayura.core')
local task = require('mayura._task')
local process = require('mayura.process')
local mcp = require('mayura.mcp')
local http = require('mayura.mcp.http')
local policy = require('mayura.policy')

local json = core.json
local TOKEN = 'conformance-token-' .. string.format('%08x', math.random(0, 0x7fffffff))
local CLI = 'spec/npm/node_modules/@modelcontextprotocol/conformance/dist/index.js'

local PASSING = { 'ping', 'server-initialize', 'server-sse-multiple-streams', 'tools-list' }

local function installed()
  local f = io.open(CLI, 'r')
  if f then f:close() end
  local ok, r = pcall(process.run, { 'node', '--version' }, { timeout_ms = 10000 })
  return f ~= nil and ok and r.exit_code == 0
end

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('a')
  f:close()
  return s
end

describe('the MCP conformance suite\'s server scenarios', function()
  if not installed() then
    pending('needs node and @modelcontextprotocol/conformance in spec/npm (sh scripts/setup.sh installs them)')
    return
  end

  it('pass but for the features and fixture tools this server does not have', function()
    local results = {}
    task.run(function()
      -- its client never ends a session: room for all of them
      local source = read('spec/mcp/policy.lua'):gsub('max_sessions = 4', 'max_sessions = 64')
        :gsub('max_sandboxes = 6', 'max_sandboxes = 64')
      local env = policy.load_policy({ { name = 'spec/mcp/policy.lua', source = source } }):open()
      local server = mcp.server({ open_session = function(id) return env:session(id) end })
      local listener = http.listen(server, { token = TOKEN })
      local dir = os.tmpname()
      os.remove(dir)
      local r = process.run({ 'node', '--import', './spec/npm/mcp_auth_fetch.mjs', CLI, 'server', '--url',
        listener:url(), '-o', dir }, { env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), MCP_TOKEN = TOKEN },
        timeout_ms = 120000 })
      listener:close()
      env:close()
      local ls = process.run({ 'ls', dir })
      for name in ls.stdout:gmatch('[^\n]+') do
        local scenario = name:match('^server%-(.-)%-%d%d%d%d%-')
        local checks = json.decode(read(dir .. '/' .. name .. '/checks.json'))
        local failed = {}
        for _, c in ipairs(checks) do
          if c.status == 'FAILURE' then failed[#failed + 1] = c.errorMessage or c.id end
        end
        results[scenario] = failed
      end
      process.run({ 'rm', '-rf', dir })
      assert(next(results), 'no results: ' .. r.stdout .. r.stderr)
    end)
    local passing, n = {}, 0
    for scenario, failed in pairs(results) do
      n = n + 1
      if #failed == 0 then
        passing[#passing + 1] = scenario
      else
        for _, msg in ipairs(failed) do
          assert.truthy(msg:find('MCP error %-32601: method not found: ') or msg:find('MCP error %-32602: unknown tool: test_'),
            scenario .. ': ' .. msg)
        end
      end
    end
    table.sort(passing)
    assert.are.same(PASSING, passing)
    assert.are.equal(26, n)   -- the suite's active server scenarios
  end)
end)
