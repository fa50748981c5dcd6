-- A host that drives the loop: mayura.step() from its own loop (a game's frame, an editor's poll of
-- backend_fd()), the driver that says who runs the loop, and what a waiting call does under a host:
-- never block it, refuse with a coded error outside a task.
local mayura = require('mayura')
local core = require('mayura.core')
local process = require('mayura.process')

-- Runs fn() with `who` driving the loop, then gives the loop back to mayura whatever happened.
local function driven_by(who, fn)
  local before = core.set_driver(who)
  local ok, err = pcall(fn)
  core.set_driver(before)
  if not ok then error(err, 0) end
end

describe('a loop driven by the host', function()
  it('starts tasks without waiting and runs them as the host steps', function()
    driven_by('step', function()
      local seen = {}
      local t = mayura.run(function()
        seen[#seen + 1] = 'task started'
        local r = process.run({ 'sh', '-c', 'echo out' })
        seen[#seen + 1] = 'command ended'
        return r.stdout
      end)
      seen[#seen + 1] = 'run returned'
      assert.is_false(t.done)
      local frames = 0
      -- nothing runs the loop but these steps: the command cannot end before the first one
      while not t.done do
        frames = frames + 1
        if frames == 1 then seen[#seen + 1] = 'first frame' end
        mayura.step(1)
      end
      assert.are.same({ 'task started', 'run returned', 'first frame', 'command ended' }, seen)
      assert.are.equal('out\n', t:wait())
    end)
  end)

  it('refuses a waiting call made at top level, with a code, instead of blocking the host', function()
    driven_by('step', function()
      local err = assert.raises_code('INVALID_INPUT', mayura.sleep, 1)
      assert.truthy(err.message:find('inside a task (mayura.run)', 1, true), err.message)
      assert.raises_code('INVALID_INPUT', core.run_once)
      assert.raises_code('INVALID_INPUT', core.run)
    end)
    driven_by('host', function()
      assert.raises_code('INVALID_INPUT', mayura.sleep, 1)
      -- the host runs that loop itself: stepping it too would run it from inside itself
      assert.raises_code('INVALID_INPUT', mayura.step)
    end)
  end)

  it('spreads tasks whose waits end together over steps once the budget is spent', function()
    local task = require('mayura._task')
    -- ms of this thread's CPU time: what a step's budget counts
    local function busy(ms)
      local t0 = core.cpu_ms()
      while core.cpu_ms() - t0 < ms do end
    end
    driven_by('step', function()
      local order, wake = {}, {}
      local tasks = {}
      for i = 1, 3 do
        tasks[i] = mayura.run(function()
          task.await(function(done) wake[i] = done end)
          order[#order + 1] = i
          busy(5)
        end)
      end
      -- one callback ends all three waits
      task.after(0, function() for i = 1, 3 do wake[i]() end end)
      local steps, seen = 0, {}
      while not tasks[3].done do
        assert.is_false(core.over_budget())
        mayura.step(2)
        steps = steps + 1
        seen[steps] = #order
        assert.is_true(steps < 100, 'the tasks never ran')
      end
      -- each step's budget (2 ms) is spent by the first task it resumes (5 ms): one task a step,
      -- in the order their waits ended
      assert.are.same({ 1, 2, 3 }, order)
      assert.are.equal(1, seen[steps - 2] - (seen[steps - 3] or 0))
      assert.are.equal(2, seen[steps - 1])
      assert.are.equal(3, seen[steps])
      -- a step without a budget resumes them all at once
      order = {}
      for i = 1, 3 do
        tasks[i] = mayura.run(function()
          task.await(function(done) wake[i] = done end)
          order[#order + 1] = i
          busy(2)
        end)
      end
      task.after(0, function() for i = 1, 3 do wake[i]() end end)
      while not tasks[3].done do mayura.step() end
      assert.are.same({ 1, 2, 3 }, order)
      for i = 1, 3 do tasks[i]:wait() end
    end)
  end)

  it('refuses step from a loop callback, and a budget out of range', function()
    driven_by('step', function()
      local err
      local t = mayura.run(function()
        mayura.sleep(1)
        err = select(2, pcall(mayura.step))
      end)
      while not t.done do mayura.step() end
      t:wait()
      assert.are.equal('INVALID_INPUT', err and err.code)
      assert.raises_code('INVALID_INPUT', mayura.step, -1)
      assert.raises_code('INVALID_INPUT', mayura.step, 1e9)
    end)
  end)

  it('gives the loop\'s fd and the time to its next timer, for a host that polls', function()
    driven_by('step', function()
      local fd = mayura.backend_fd()
      assert.is_true(type(fd) == 'number' and fd >= 0)
      local t = mayura.run(function() mayura.sleep(200) end)
      local ms = mayura.backend_timeout()
      assert.is_true(ms > 0 and ms <= 200, tostring(ms))
      while not t.done do mayura.step() end
      assert.are.equal('step', mayura.driver())
    end)
    assert.are.equal('mayura', mayura.driver())
    assert.raises_code('INVALID_INPUT', core.set_driver, 'nobody')
  end)
  it('puts work that cannot be cut off to the next step once a share of the budget is spent', function()
    local task = require('mayura._task')
    driven_by('step', function()
      local t = mayura.run(function()
        mayura.sleep(0)                               -- from here on, inside the host's steps
        local _, first = core.over_budget()
        local t0 = core.cpu_ms()
        while core.cpu_ms() - t0 < 4 do end          -- 4 ms of CPU of a 10 ms budget: over a quarter
        task.fresh_step(0.25)
        local _, second = core.over_budget()
        task.fresh_step(0.25)                         -- at the start of a step: goes on at once
        local _, third = core.over_budget()
        return first, second, third
      end)
      while not t.done do mayura.step(10) end
      local first, second, third = t:wait()
      assert.are.equal(first + 1, second)
      assert.are.equal(second, third)
    end)
    -- with no budget (mayura runs its own loop) it never waits
    local t = task.spawn(function() task.fresh_step(0.25) return 'went on' end)
    assert.is_true(t.done)
    assert.are.equal('went on', t:wait())
    assert.raises_code('INVALID_INPUT', core.over_budget, 0)
    assert.raises_code('INVALID_INPUT', core.over_budget, 1.5)
  end)

  it('ends a step whose only work left is put off, instead of passing over it until the budget is spent', function()
    local task = require('mayura._task')
    driven_by('step', function()
      local t = mayura.run(function()
        mayura.sleep(0)
        local t0 = core.cpu_ms()
        while core.cpu_ms() - t0 < 120 do end           -- 120 ms of CPU of a 400 ms budget: over a quarter
        task.fresh_step(0.25)
      end)
      local took
      while not t.done do
        local t0 = core.cpu_ms()
        mayura.step(400)
        local spent = core.cpu_ms() - t0
        if spent >= 120 and not took then took = spent end
      end
      -- the step that ran the 120 ms returns soon after them, not once its budget is spent (work
      -- starts within three quarters of it: 300 ms)
      assert.is_true(took ~= nil and took < 250, tostring(took))
    end)
  end)

  it('ends the step at core.end_step: what else is due waits for the next step', function()
    driven_by('step', function()
      local steps = {}
      local function sleeper(name, ends)
        return mayura.run(function()
          mayura.sleep(5)
          local _, at = core.over_budget()
          steps[name] = at
          if ends then core.end_step() end
        end)
      end
      local a, b = sleeper('a', true), sleeper('b', false)
      local t0 = core.hrtime_ms()
      while core.hrtime_ms() - t0 < 20 do end          -- both sleeps are over before the first step
      while not (a.done and b.done) do mayura.step(50) end
      -- without end_step both would end in the one step: its budget is far from spent
      assert.are.equal(steps.a + 1, steps.b)
    end)
    core.end_step()                                   -- with no step running: nothing
  end)

  it('takes core.expect_bytes as a hint that changes nothing in a state of another allocator', function()
    core.expect_bytes(16 * 1024 * 1024)
    core.expect_bytes(0)
    assert.raises_code('INVALID_INPUT', core.expect_bytes, -1)
    assert.raises_code('INVALID_INPUT', core.expect_bytes, 'many')
    assert.raises_code('INVALID_INPUT', core.expect_bytes, 2 ^ 41)
  end)
end)
