--- Checks the fault specs of hosted providers share: an error is a SANDBOX_ERROR of the
-- expected reason that shows no secret and none of the service's own words, anywhere in it.
--
--   local check = require('support.fault_checks').checker({ TOKEN }, { 'is not valid' })
--   local err = check('gone', sb.exec, sb, { 'true' })
local assert = require('luassert')

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

return M
