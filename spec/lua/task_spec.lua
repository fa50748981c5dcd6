-- mayura.run, waiting calls, cancel tokens and coded errors.
local mayura = require('mayura')
local errors = require('mayura.errors')
local task = require('mayura._task')
local process = require('mayura.process')
local core = require('mayura.core')

describe('tasks', function()
  describe('failure modes', function()
    it('run refuses a non-function', function()
      local ok, err = pcall(mayura.run, 42)
      assert.is_false(ok)
      assert.are.equal('INVALID_INPUT', err.code)
    end)

    it('a waiting call from a loop callback outside a task is refused, not run nested', function()
      local uv = require('luv')
      local seen
      local timer = uv.new_timer()
      timer:start(1, 0, function()
        timer:close()
        local ok, err = pcall(mayura.sleep, 1)
        seen = { ok = ok, err = err }
      end)
      while not seen do core.run_once() end
      assert.is_false(seen.ok)
      assert.are.equal('INVALID_INPUT', seen.err.code)
    end)

    it('run from top level raises the task error', function()
      local ok, err = pcall(mayura.run, function() errors.raise('LIMIT_EXCEEDED', 'too many') end)
      assert.is_false(ok)
      assert.are.equal('LIMIT_EXCEEDED', err.code)
      assert.are.equal('LIMIT_EXCEEDED: too many', tostring(err))
    end)
  end)

  it('run from top level drives the loop and returns the results', function()
    local a, b = mayura.run(function(x)
      mayura.sleep(5)
      return x + 1, 'done'
    end, 41)
    assert.are.equal(42, a)
    assert.are.equal('done', b)
  end)

  it('tasks started inside a task run concurrently and can be joined', function()
    local order = {}
    local total = mayura.run(function()
      local started = core.hrtime_ms()
      local children = {}
      for i = 1, 5 do
        children[i] = mayura.run(function()
          mayura.sleep(100)
          table.insert(order, i)
          return i
        end)
      end
      local sum = 0
      for i = 1, 5 do sum = sum + children[i]:wait() end
      return sum, core.hrtime_ms() - started
    end)
    assert.are.equal(15, total)
    assert.are.equal(5, #order)
  end)

  it('runs many commands concurrently in tasks', function()
    local out = mayura.run(function()
      local ts = {}
      for i = 1, 20 do
        ts[i] = mayura.run(function() return process.run({ 'sh', '-c', 'sleep 0.2; echo $0', tostring(i) }).stdout end)
      end
      local r = {}
      for i = 1, 20 do r[i] = ts[i]:wait() end
      return r
    end)
    for i = 1, 20 do assert.are.equal(i .. '\n', out[i]) end
  end)

  it('a failing task started inside another does not stop the loop', function()
    local after = mayura.run(function()
      local t = mayura.run(function() error('fails on purpose') end)
      local ok = pcall(t.wait, t)
      mayura.sleep(1)
      return ok
    end)
    assert.is_false(after)
  end)
end)

describe('cancel tokens', function()
  it('cancel sets cancelled, calls handlers once, and again does nothing', function()
    local token = mayura.cancel_token()
    local calls = 0
    token:on_cancel(function() calls = calls + 1 end)
    local remove = token:on_cancel(function() calls = calls + 100 end)
    remove()
    assert.is_false(token.cancelled)
    token:cancel()
    token:cancel()
    assert.is_true(token.cancelled)
    assert.are.equal(1, calls)
    assert.is_true(task.is_token(token))
    local late = false
    token:on_cancel(function() late = true end)
    assert.is_true(late)
  end)
end)

describe('errors', function()
  it('are tables with code and message, and tostring gives CODE: message', function()
    local e = errors.new('SANDBOX_ERROR', 'it is gone', { reason = 'gone' })
    assert.are.equal('SANDBOX_ERROR: it is gone', tostring(e))
    assert.is_true(errors.is(e))
    assert.is_true(errors.is(e, 'SANDBOX_ERROR'))
    assert.is_false(errors.is(e, 'INVALID_INPUT'))
    assert.is_false(errors.is('SANDBOX_ERROR'))
    assert.are.equal('INTERNAL', errors.wrap('x').code)
    assert.has_error(function() return errors.codes.NOT_A_CODE end)
  end)
end)

describe('timers', function()
  it('after calls its function once, and a cancelled one never', function()
    local calls, never = 0, 0
    mayura.run(function()
      task.after(10, function() calls = calls + 1 end)
      local h = task.after(10, function() never = never + 1 end)
      assert.is_true(h.cancel(true))
      assert.is_false(h.cancel())
      task.sleep(50)
    end)
    assert.are.equal(1, calls)
    assert.are.equal(0, never)
  end)

  it('sleep with a token ends early with CANCELLED when it is cancelled, and sleeps out otherwise', function()
    mayura.run(function()
      local token = task.cancel_token()
      local order = {}
      task.after(20, function() order[#order + 1] = 'cancel'; token:cancel() end)
      task.after(5000, function() order[#order + 1] = 'too late' end).cancel()
      local err = assert.raises_code('CANCELLED', task.sleep, 60000, token, 'stopped here')
      assert.are.equal('stopped here', err.message)
      assert.are.same({ 'cancel' }, order)
      -- an uncancelled token: the sleep ends by itself
      task.sleep(5, task.cancel_token())
      -- a token cancelled before: at once
      assert.raises_code('CANCELLED', task.sleep, 60000, token)
    end)
  end)

  it('with_timeout returns the work\'s results, re-raises its error, and raises its own past the time', function()
    mayura.run(function()
      local a, b = task.with_timeout(1000, function() task.sleep(5) return 1, 2 end, 'unused')
      assert.are.same({ 1, 2 }, { a, b })
      local e = assert.raises_code('INVALID_INPUT', task.with_timeout, 1000, function()
        errors.raise('INVALID_INPUT', 'from the work')
      end, 'unused')
      assert.are.equal('from the work', e.message)
      local late = {}
      e = assert.raises_code('SANDBOX_ERROR', task.with_timeout, 10, function()
        task.sleep(60)
        return 'finally'
      end, function() return errors.sandbox('timeout', 'too slow') end, function(ok, v)
        late.ok, late.v = ok, v
      end)
      assert.are.equal('timeout', e.reason)
      assert.is_nil(late.ok)
      while late.ok == nil do task.sleep(10) end
      assert.is_true(late.ok)
      assert.are.equal('finally', late.v)
    end)
  end)

  -- A script of a plain interpreter (no host program) that ends right after a wait: the state is
  -- closed with whatever the last loop pass left, and luv's finalizer must find no half-closed handle.
  describe('a plain interpreter script that ends right after a wait', function()
    local compat = require('support.compat')
    local SCRIPTS = {
      sleep = "task.run(function() task.sleep(5) end)",
      after = "task.await(function(done) task.after(5, done) end)",
      cancelled_timer = "local t = task.after(60000, function() end); t.cancel(); task.run(function() task.sleep(1) end)",
      process = "local r = require('mayura.process').run({ 'true' }); assert(r.exit_code == 0)",
      many = "for _ = 1, 20 do task.run(function() task.sleep(1) end) end",
    }
    for name, body in pairs(SCRIPTS) do
      it('exits 0 (' .. name .. ')', function()
        local script = "local task = require('mayura._task'); " .. body .. "; io.write('done')"
        local r = process.run({ compat.lua, '-e', script }, { timeout_ms = 60000, env = {
          PATH = os.getenv('PATH'), HOME = os.getenv('HOME'),
          LUA_PATH = 'lua/?.lua;lua/?/init.lua;providers/?.lua;;', LUA_CPATH = compat.cpath .. ';;' } })
        assert.are.equal('done', r.stdout, r.stderr)
        assert.are.equal(0, r.exit_code, 'signal ' .. tostring(r.signal) .. ' ' .. r.stderr)
      end)
    end
  end)
end)
