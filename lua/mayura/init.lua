--- mayura: agents that work in isolated Linux sandboxes, with permissions, limits and budgets.
--
-- This facade gives the runtime (`define_agent`, `define_hook`,
-- `create_runtime`), schemas (`z`), cancel tokens and tasks (`run`), policy files
-- (`load_policy(path_or_list)`, and `policy()`: the one the host program's
-- `--policy` loaded, or nil). Its
-- parts load on first use, so `require('mayura')` stays cheap.
local task = require('mayura._task')

local M = {
  _VERSION = require('mayura.core').version,
  run = task.run,
  cancel_token = task.cancel_token,
  sleep = task.sleep,
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
