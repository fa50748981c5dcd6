--- Checks and scaffolding the fault specs of hosted providers share: an error is a SANDBOX_ERROR of
-- the expected reason that shows no secret and none of the service's own words, anywhere in it;
-- and `hosted_suite`, the describe block of a provider whose stand-in (support/*_service.lua)
-- runs over real local sandboxes, with the cases every such suite has in common.
--
--   local check = require('support.fault_checks').checker({ TOKEN }, { 'is not valid' })
--   local err = check('gone', sb.exec, sb, { 'true' })
-- busted's API, as a spec file sees it (a module does not get its environment)
local busted = require('busted')
local assert = require('luassert')
local describe, pending = busted.describe, busted.pending
local setup, teardown, after_each = busted.setup, busted.teardown, busted.after_each

local M = {}

--- Whether `needle` appears anywhere in `v`: its tostring, its fields and their fields.
function M.shows(v, needle, seen)
  seen = seen or {}
  if type(v) == 'string' then return v:find(needle, 1, true) ~= nil end
  if type(v) ~= 'table' or seen[v] then return false end
  seen[v] = true
  if tostring(v):find(needle, 1, true) then return true end
  for k, x in pairs(v) do
    if M.shows(k, needle, seen) or M.shows(x, needle, seen) then return true end
  end
  return false
end

--- A function (reason, fn, ...) that asserts fn(...) raises SANDBOX_ERROR `reason` showing
-- none of `secrets` and none of `words`, and returns the error.
function M.checker(secrets, words)
  return function(reason, fn, ...)
    local err = assert.raises_code('SANDBOX_ERROR', fn, ...)
    assert.are.equal(reason, err.reason, tostring(err))
    for _, s in ipairs(secrets) do assert.is_false(M.shows(err, s), 'a secret shows in ' .. tostring(err)) end
    for _, w in ipairs(words) do assert.is_false(M.shows(err, w), 'the service\'s words show in ' .. tostring(err)) end
    return err
  end
end

--- The file calls of sandbox `sb` on x.txt (exec, read, write, list, remove), each a function of
-- no arguments, for the cases where every one of them must fail alike.
function M.file_calls(sb)
  return {
    function() return sb:exec({ 'true' }) end,
    function() return sb:read_file('x.txt') end,
    function() return sb:write_file('x.txt', 'y') end,
    function() return sb:list_files('.') end,
    function() return sb:remove_file('x.txt') end,
  }
end

-- Whether local sandboxes (bubblewrap and the agent) can be made here.
local can_run_local

local function merged(base, extra)
  local o = {}
  for k, v in pairs(base) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

--- The fault suite of one hosted provider: a describe block titled `s.title` that is pending
-- where local sandboxes cannot run, and otherwise starts a stand-in service (`svc`) over a local
-- backing of six sandboxes and gives `s.cases(env)` the environment to declare its `it` cases in:
--   env.svc, env.backing, env.state   the stand-in, its backing, what s.install(svc, backing, env) returned
--   env.check                         M.checker(s.secrets, s.words)
--   env.CREATE                        the create options every case uses (s.create, default all network)
--   env.make_pool(extra, pool_opts)   a pool over s.provider(s.options(svc) + extra), pool options
--                                     s.pool (default two sandboxes, all network) + pool_opts
--   env.open(extra, pool_opts)        such a pool and one sandbox of it
--   env.all_fail(reason, sb)          every call of M.file_calls(sb) is env.check'ed `reason`
--   env.retry_after(sb, o)            the common 429 case (see below); env.retry_after_on(method, path)
--                                     the whole case on one route of the stand-in
--   env.refused(extra)                a pool with a wrong credential cannot create
--   env.goes_on(pool)                 a new sandbox of pool runs a command, and the pool closes
--   env.exec_times_out(sb, stall, o) an exec (options o) stalled by stall() is timeout, and the next one runs
--   env.direct_outlasts_call_timeout() a command its call waits for outlasts call_timeout_ms
-- After each case the stand-in's faults are cleared and s.reset(env) runs; at the end s.teardown(env)
-- runs, the backing closes and the stand-in must have recorded no failure but those in s.expected_failures.
function M.hosted_suite(s)
  if can_run_local == nil then
    can_run_local = pcall(function() require('mayura.sandbox.local').local_sandboxes({}) end)
  end
  describe(s.title, function()
    if not can_run_local then
      pending('needs local sandboxes (bubblewrap and the agent): not available here')
      return
    end
    local sandbox = require('mayura.sandbox')
    local stand_in = require('support.stand_in')
    local env = { check = M.checker(s.secrets, s.words), CREATE = s.create or { lifetime_ms = 60000, network = 'all' } }
    local pool_base = s.pool or { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } }

    function env.make_pool(extra, pool_options)
      return sandbox.create_sandboxes(s.provider(merged(s.options(env.svc), extra)), merged(pool_base, pool_options))
    end

    function env.open(extra, pool_options)
      local pool = env.make_pool(extra, pool_options)
      return pool, pool:create(env.CREATE)
    end

    function env.all_fail(reason, sb)
      for _, call in ipairs(M.file_calls(sb)) do env.check(reason, call) end
    end

    --- A 429 of one second is waited out and the exec goes on; one of 60 s is rate_limited at once,
    -- with its retry_after_ms. o.calls() lists the exec requests so far, o.at(req) is when one
    -- came (default req.at_ms), o.fault(answer) makes the next exec answer `answer`, o.fault_long
    -- (default o.fault) the next read_file.
    function env.retry_after(sb, o)
      local at = o.at or function(req) return req.at_ms end
      local before = #o.calls()
      o.fault(stand_in.rate_limited(1))
      assert.are.equal('after the wait\n', sb:exec({ 'echo', 'after the wait' }).stdout)
      local calls = o.calls()
      local waited = at(calls[before + 2]) - at(calls[before + 1])
      assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
      ;(o.fault_long or o.fault)(stand_in.rate_limited(60))
      local err = env.check('rate_limited', sb.read_file, sb, 'x')
      assert.are.equal(60000, err.retry_after_ms)
      return err
    end

    --- The common 429 case on the stand-in's route `method` `path` (the exec): env.retry_after on
    -- a new sandbox, then the faults are cleared and after(sb) (optional) runs before the end.
    function env.retry_after_on(method, path, after)
      local pool, sb = env.open()
      env.retry_after(sb, {
        calls = function() return env.svc:calls(method, path) end,
        fault = function(answer) env.svc:fault(method, path, answer, 1) end,
      })
      env.svc:clear()
      if after then after(sb) end
      sb:release()
      pool:close()
    end

    --- A pool with the options `extra` (a wrong credential) cannot create: `reason` (default
    -- authentication), and it holds no sandbox.
    function env.refused(extra, reason)
      local pool = env.make_pool(extra)
      env.check(reason or 'authentication', pool.create, pool, env.CREATE)
      assert.are.equal(0, pool:count())
      pool:close()
    end

    --- stall() makes the next exec stall: that exec of `sb` is timeout, and once the stand-in's
    -- faults are cleared the next one runs.
    function env.exec_times_out(sb, stall, exec_options)
      stall()
      env.check('timeout', sb.exec, sb, { 'echo', 'lost' }, exec_options)
      env.svc:clear()
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    end

    --- A command the call itself waits for (the transport's direct_ms) may take longer than the
    -- pool's call_timeout_ms: its call is given the command's time as well.
    function env.direct_outlasts_call_timeout()
      local pool, sb = env.open(nil, { call_timeout_ms = 1000 })
      local r = sb:exec({ 'sh', '-c', 'sleep 2; echo done' }, { timeout_ms = 10000 })
      assert.are.same({ 0, 'done\n' }, { r.exit_code, r.stdout })
      sb:release()
      pool:close()
    end

    --- After a fault, `pool` goes on: a new sandbox of it runs a command; then the pool closes.
    function env.goes_on(pool)
      local sb = pool:create(env.CREATE)
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      sb:release()
      pool:close()
    end

    setup(function()
      env.svc = stand_in.new()
      env.backing = stand_in.local_backing({ max_sandboxes = 6 })
      env.state = s.install(env.svc, env.backing, env)
    end)

    teardown(function()
      if s.teardown then s.teardown(env) end
      env.backing:close()
      local others = {}
      for _, f in ipairs(env.svc.failures) do
        local expected = false
        for _, e in ipairs(s.expected_failures or {}) do expected = expected or f == e end
        if not expected then others[#others + 1] = f end
      end
      assert.are.same({}, others)
      env.svc:close()
    end)

    after_each(function()
      env.svc:clear()
      if s.reset then s.reset(env) end
    end)

    s.cases(env)
  end)
end

return M
