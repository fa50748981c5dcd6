--- mayura: agents that work in isolated Linux sandboxes, with permissions, limits and budgets.
--
-- This facade gives the runtime (`define_agent`, `define_hook`,
-- `create_runtime`), schemas (`z`), cancel tokens and tasks (`run`), policy files
-- (`load_policy(path_or_list)`, and `policy()`: the one the host program's
-- `--policy` loaded, or nil). Its
-- parts load on first use, so `require('mayura')` stays cheap.
--
-- Embedding: a host that owns its loop calls `mayura.step(budget_ms)` from
-- it (a game's frame; or when `mayura.backend_fd()` is readable, within
-- `mayura.backend_timeout()` ms); from then on `mayura.run(fn)` returns the
-- task at once and every wait happens inside tasks. In Neovim the core runs
-- on `vim.loop`, which the editor runs (`mayura.driver()` is 'host').
local core = require('mayura.core')
local task = require('mayura._task')

local M = {
  _VERSION = core.version,
  run = task.run,
  cancel_token = task.cancel_token,
  sleep = task.sleep,
  step = core.step,
  backend_fd = core.backend_fd,
  backend_timeout = core.backend_timeout,
  set_driver = core.set_driver,
  driver = core.driver,
}

-- Functions that live in submodules, loaded when first asked for.
local lazy = {
  define_agent = 'mayura.runtime',
  define_hook = 'mayura.runtime',
  create_runtime = 'mayura.runtime',
  z = 'mayura.z',
  load_policy = 'mayura.policy',
  policy = 'mayura.policy',
}

return setmetatable(M, {
  __index = function(t, k)
    local mod = lazy[k]
    if mod == nil then return nil end
    local m = require(mod)
    local v = m[k]
    if v == nil and k == 'z' then v = m end
    rawset(t, k, v)
    return v
  end,
})
