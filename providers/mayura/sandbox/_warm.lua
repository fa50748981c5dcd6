--- mayura.sandbox._warm: warm sandboxes, the pool's protocol on the provider's side.
--
-- A provider with the option `warm = n` keeps n sandboxes of its default shape made ahead of time
-- for the pool made over it, so a create of that shape takes what an exec takes. The local and
-- Docker providers use it through mayura.sandbox._agent_backend, the hosted ones through the kit
-- (mayura.sandbox._kit); the pool's side is in mayura.sandbox (warm_attach, warm_claim, ...).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')

local M = {}

--- Whether two label tables are the same (nil is none): a warm sandbox's labels are fixed when it
-- is made, so only a create asking for exactly the pool's takes one.
function M.same_labels(a, b)
  for k, v in pairs(a or {}) do if (b or {})[k] ~= v then return false end end
  for k, v in pairs(b or {}) do if (a or {})[k] ~= v then return false end end
  return true
end

-- A sandbox whose hand_out failed: released, and the failure raised.
local function failed(_, backend, err)
  pcall(backend.release, backend)
  error(errors.is(err) and err or errors.sandbox('failed', 'the sandbox could not be handed out'), 0)
end


--- Gives the provider `p` (its option `warm = n`) a set of `n` sandboxes of its default shape,
-- started ahead of time (the agent up and its hello said, no setup yet). Hooks:
--   `make(p, lifetime_ms, labels)`: a started backend of the default shape (raises on failure);
--   `matches(p, spec, labels)`: whether a create's spec asks for exactly that shape;
--   `hand_out(p, backend, spec)`: what a claimed sandbox needs for this create (the agent's setup,
--   the env and lifetime asked for, ...);
--   `failed(p, backend, err, spec)` (optional): ends a sandbox whose hand_out failed, and raises
--   or returns the backend the create gets instead (by default it is released and `err` raised,
--   anything uncoded as SANDBOX_ERROR `failed`).
-- The set belongs to one pool at a time (`warm_attach(budget)`, made by create_sandboxes): its
-- sandboxes live `budget.max_lifetime_ms` (their own lifetime: at its end one is destroyed and
-- replaced), carry `budget.labels`, and are started only while `budget.may_fill()` says the pool
-- has a free slot (they count against its max_sandboxes: `warm_held()` counts those ready, being
-- started and being destroyed). `warm_claim(budget, spec)` takes a ready one that fits the spec out
-- of the set (the pool then passes it to `create` as its third argument, which hands it out) and
-- refills in the background; a released sandbox is always destroyed, never put back.
-- `warm_evict(budget)` destroys one ready sandbox to make room for a create of another shape;
-- `warm_detach(budget)` (the pool's close) stops refilling and returns once every warm sandbox,
-- those being started too, is destroyed. `p:close()` does the same for whichever pool holds it.
-- A host that dies leaves none: they are sandboxes like the others (the local launcher ends one
-- when the host's end of its control socket closes; a Docker agent ends its container when the
-- host's connection closes; a hosted service ends one at its lifetime).
function M.add(p, n, hooks)
  p.warm = n
  local ready = {}          -- { backend, ends_at (hrtime ms), timer } each, oldest first
  local starting, ending = 0, 0
  local owner               -- the budget of the pool the set belongs to, or nil
  local idle = {}           -- who waits for nothing to be started or destroyed
  local retry               -- a refill's timer after a failed start
  local claimed = setmetatable({}, { __mode = 'k' })
  local made, made_next = {}, 0   -- the last 64 backends started, for `warm_made`
  local fill

  local function settle()
    if starting > 0 or ending > 0 then return end
    local waiters = idle
    idle = {}
    for _, done in ipairs(waiters) do done() end
  end

  -- Destroys a warm sandbox in a task of its own; it counts until its release has returned.
  local function destroy(b)
    ending = ending + 1
    task.spawn(function()
      pcall(b.release, b)
      ending = ending - 1
      settle()
      fill()
    end)
  end

  local function drop(e)
    if e.timer then
      e.timer.cancel()
      e.timer = nil
    end
  end

  fill = function()
    local o = owner
    while o and owner == o and not retry and #ready + starting < n and o.may_fill() do
      starting = starting + 1
      task.spawn(function()
        local t0 = core.hrtime_ms()
        local ok, b = pcall(hooks.make, p, o.max_lifetime_ms, o.labels)
        if ok then
          made_next = made_next % 64 + 1
          made[made_next] = b
        end
        if ok and owner ~= o then
          destroy(b)
        elseif ok then
          local e = { backend = b, ends_at = t0 + o.max_lifetime_ms }
          -- its own lifetime: then it goes, and another takes its place
          e.timer = task.after(math.max(1, o.max_lifetime_ms - math.floor(core.hrtime_ms() - t0)), function()
            e.timer = nil
            for i, x in ipairs(ready) do
              if x == e then
                table.remove(ready, i)
                destroy(b)
                break
              end
            end
          end, true)
          ready[#ready + 1] = e
        elseif owner == o and not retry then
          -- a start that failed is tried again a second later, not at once
          retry = task.after(1000, function()
            retry = nil
            fill()
          end, true)
        end
        starting = starting - 1
        settle()
      end)
    end
  end

  function p.warm_attach(_, budget)
    if owner or n == 0 then return nil end
    owner = budget
    -- on the loop's next turn: making the pool stays quick
    task.after(0, function() fill() end, true)
    return budget
  end

  function p.warm_held()
    return #ready + starting + ending
  end

  --- How many are ready to be handed out.
  function p.warm_ready()
    return #ready
  end

  --- The backends of the last 64 warm sandboxes started (ready, handed out or destroyed): what a
  -- check of what is left on the host looks at.
  function p.warm_made()
    local out = {}
    for _, b in pairs(made) do out[#out + 1] = b end
    return out
  end

  function p.warm_fill(_, budget)
    if budget and owner == budget then fill() end
  end

  function p.warm_claim(self, budget, spec)
    if not budget or owner ~= budget then return nil end
    local now = core.hrtime_ms()
    local i = 1
    while i <= #ready do
      local e = ready[i]
      if e.backend.closed then
        -- ended on its own (killed from outside, say): gone from the set
        table.remove(ready, i)
        drop(e)
        destroy(e.backend)
      elseif e.ends_at - now >= spec.lifetime_ms + 1000 and hooks.matches(self, spec, budget.labels) then
        table.remove(ready, i)
        drop(e)
        claimed[e] = true
        task.after(0, function() fill() end, true)
        return e
      else
        i = i + 1
      end
    end
    return nil
  end

  function p.warm_evict(_, budget)
    if not budget or owner ~= budget or #ready == 0 then return false end
    local e = table.remove(ready, 1)
    drop(e)
    ending = ending + 1
    pcall(e.backend.release, e.backend)
    ending = ending - 1
    settle()
    return true
  end

  function p.warm_detach(_, budget)
    if not budget or owner ~= budget then return end
    owner = nil
    if retry then
      retry.cancel()
      retry = nil
    end
    local list = ready
    ready = {}
    for _, e in ipairs(list) do
      drop(e)
      destroy(e.backend)
    end
    if starting > 0 or ending > 0 then
      task.await(function(done) idle[#idle + 1] = done end)
    end
  end

  function p.close(self)
    if owner then self:warm_detach(owner) end
  end

  local cold = p.create
  function p.create(self, spec, warm)
    if warm ~= nil and claimed[warm] then
      claimed[warm] = nil
      local b = warm.backend
      local ok, err = pcall(hooks.hand_out, self, b, spec)
      if not ok then return (hooks.failed or failed)(self, b, err, spec) end
      return b
    end
    return cold(self, spec)
  end
  return p
end


return M
