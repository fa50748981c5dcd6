-- `mayura serve` as the official MCP TypeScript client (@modelcontextprotocol/sdk, pinned in
-- spec/npm/package.json) sees it, over stdio and over Streamable HTTP on loopback, with the
-- specs' policy (spec/mcp/policy.lua: the workspace tools, remove not granted) and real local
-- sandboxes. spec/npm/mcp_sdk.mjs runs the scenarios and prints what it saw; each `it` here
-- asserts one scenario.
local core = require('mayura.core')
local process = require('mayura.process')
local sandbox = require('mayura.sandbox')

local json = core.json
local HOST = require('support.compat').host

local can_run_local = pcall(function()
  local local_provider = require('mayura.sandbox.local')
  local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(), { max_sandboxes = 1, max_lifetime_ms = 60000 })
  local sb = pool:create({ lifetime_ms = 60000 })
  sb:release()
  pool:close()
end)

local function node_ok()
  local ok, r = pcall(process.run, { 'node', '--version' }, { timeout_ms = 10000 })
  return ok and r.exit_code == 0
end

local function sdk_installed()
  local f = io.open('spec/npm/node_modules/@modelcontextprotocol/sdk/package.json', 'r')
  if f then f:close() end
  return f ~= nil
end

for _, kind in ipairs({ 'stdio', 'http' }) do
  describe('mayura serve over ' .. kind .. ', through the official MCP client', function()
    if not can_run_local then
      pending('needs local sandboxes (bubblewrap and the agent): not available here')
      return
    end
    if not node_ok() or not sdk_installed() then
      pending('needs node and @modelcontextprotocol/sdk in spec/npm (sh scripts/setup.sh installs them)')
      return
    end
    local out, raw
    local log = os.tmpname()

    setup(function()
      local r = process.run({ 'node', 'spec/npm/mcp_sdk.mjs', kind, HOST, 'spec/mcp/policy.lua', log },
        { env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME') }, timeout_ms = 90000 })
      raw = r
      local line = r.stdout:match('([^\n]+)\n?$')
      local ok, v = pcall(json.decode, line or '')
      out = ok and v or {}
    end)

    teardown(function() os.remove(log) end)

    local function scenario(name)
      local s = out[name]
      assert(s, 'no result for ' .. name .. ': ' .. tostring(raw and (raw.stdout .. raw.stderr)))
      assert(s.ok, name .. ' failed: ' .. tostring(s.error))
      return s
    end

    it('initializes with the current revision and lists the tools it may call with their JSON Schemas', function()
      local init = scenario('initialize')
      assert.are.equal('mayura', init.server)
      assert.are.same({ 'tools' }, init.capabilities)
      if kind == 'http' then assert.are.equal('2025-11-25', init.protocol) end
      local list = scenario('list')
      -- workspace.remove is declared but not granted: not listed
      assert.are.same({ 'workspace.exec', 'workspace.list', 'workspace.read', 'workspace.write' }, list.names)
      assert.are.same({ 'command' }, list.exec_required)
      assert.are.equal('object', list.exec_type)
      assert.is_true(list.has_description)
    end)

    it('writes, reads and runs commands in the session\'s sandbox (uid 1000)', function()
      local s = scenario('write_read_exec')
      assert.is_false(s.write_error)
      assert.are.equal('hello from a', s.read_text)
      assert.are.equal('hello from a\n1000\n', s.exec_stdout)
      assert.are.equal(0, s.exec_code)
      assert.are.equal(s.exec_stdout, s.content_text)
    end)

    it('answers a tool the policy does not grant as a tool error with the coded message, and does nothing', function()
      local s = scenario('denied')
      assert.is_true(s.is_error)
      assert.are.equal('PERMISSION_DENIED: calling workspace.remove needs the grant tool:workspace.remove', s.text)
      assert.are.equal('hello from a', s.file_kept)
    end)

    it('answers bad arguments as a tool error, and an unknown tool as -32602', function()
      local s = scenario('bad_arguments')
      assert.is_true(s.is_error)
      assert.truthy(s.text:find('^INVALID_INPUT: command'))
      assert.is_true(scenario('unknown_tool').raised)
      assert.are.equal(-32602, out.unknown_tool.code)
    end)

    it('stops a command at its timeout, and stops it too when the client gives up on the request', function()
      assert.is_true(scenario('command_timeout').timed_out)
      local s = scenario('request_timeout')
      assert.are.equal(-32001, s.code)   -- the client's RequestTimeout
      assert.is_true(s.stopped)
    end)

    it('sends progress while a command runs, and a cancel stops the command and what it started', function()
      local s = scenario('progress_and_cancel')
      assert.is_true(s.started)
      assert.is_true(s.progress >= 2)
      assert.are.equal(1, s.first_progress)
      assert.is_true(s.output_seen)   -- the command's output came as a progress message while it ran
      assert.is_true(s.rising)
      assert.are.equal('rejected: McpError', s.outcome)
      assert.is_true(s.stopped)
      assert.are.equal('still here\n', s.session_still_works)
    end)

    it('keeps each session\'s files from every other session', function()
      local s = scenario('isolation')
      assert.is_true(s.a_reads_b)
      assert.are.equal('NOT_FOUND: there is no file at secret.txt', s.a_text)
      assert.are.equal('notes\ncat: /workspace/secret.txt: No such file or directory\n', s.a_ls)
      assert.is_true(s.b_reads_a)
    end)

    it('releases a session\'s sandbox, and everything in it, when the client disconnects', function()
      local s = scenario('disconnect_releases')
      assert.is_true(s.running)
      assert.is_true(s.released)
    end)

    it('logs every call, its grant decision and each session\'s end, without the token', function()
      local s = scenario('log')
      for _, e in ipairs({ 'cancelled', 'session_closed', 'session_opened', 'stopped', 'tool_call' }) do
        assert.truthy(table.concat(s.events, ' '):find(e, 1, true), e)
      end
      assert.are.equal(1, s.denied)
      assert.are.equal(3, s.closed_released)
      assert.is_false(s.token_leaked)
    end)
  end)
end
