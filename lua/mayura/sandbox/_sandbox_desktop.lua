--- mayura.sandbox._sandbox_desktop: `sandbox.desktop`, the provider's desktop behind the pool's checks.
--
-- Every call's arguments checked (x, y whole numbers, a button, a direction, text and key names),
-- held to the sandbox's life and to the pool's call timeout as the sandbox's own calls are, and
-- what the provider returns checked (a PNG, a size, a URL). mayura.sandbox says what each method
-- does; `new(sandbox)` makes one for a sandbox whose backend has a `desktop`.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local checks = require('mayura.sandbox._checks')

local M = {}

local gone, alive, with_deadline, provider_error, bad_reply =
  checks.gone, checks.alive, checks.with_deadline, checks.provider_error, checks.bad_reply

-- `sandbox.desktop`: the provider's desktop (the backend's `desktop`), each call checked, held to the
-- sandbox's life and to the pool's call timeout as the sandbox's own calls are.
local Desktop = {}
Desktop.__index = Desktop

local BUTTONS = { left = true, right = true, middle = true }
local DIRECTIONS = { up = true, down = true, left = true, right = true }
local MAX_COORDINATE = 65535
local MAX_TYPE_BYTES = 65536
local TYPE_MS_PER_BYTE = 50            -- the call timeout grows with what is typed
local PNG_SIGNATURE = '\137PNG\r\n\26\n'

local function new_desktop(sandbox)
  return setmetatable({ _sandbox = sandbox }, Desktop)
end

-- Calls the backend's desktop[name] within the call timeout (plus `extra_ms`), mapping failures.
function Desktop:_call(extra_ms, name, ...)
  local sb = self._sandbox
  alive(sb)
  local d = sb._backend.desktop
  if type(d[name]) ~= 'function' then
    errors.raise('INVALID_INPUT', 'this provider\'s desktop cannot ' .. (name:gsub('_', ' ')), nil, 3)
  end
  local args, n = { ... }, select('#', ...)
  local ok, res = pcall(with_deadline, sb._pool.call_timeout_ms + extra_ms, function()
    return d[name](d, check.unpack(args, 1, n))
  end)
  if not ok then
    local err = provider_error(res)
    if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then sb._gone = true end
    if sb._released or core.hrtime_ms() >= sb._expires_at then err = gone() end
    error(err, 0)
  end
  return res
end

local function coordinate(v, name)
  return check.int(v, name, 0, MAX_COORDINATE, 'INVALID_INPUT', 4)
end

-- `{ x, y, ... }` with x and y both given (or, when `optional`, neither), and only `extra` keys besides.
local function point(o, what, extra, optional)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', what .. ' expects a table', nil, 4) end
  -- a bare pair { x, y } (drag's from and to) reads as { x = ..., y = ... }
  if not extra and o[1] ~= nil and o.x == nil and o.y == nil and next(o, 2) == nil and #o == 2 then
    o = { x = o[1], y = o[2] }
  end
  local keys = { x = true, y = true }
  for k in pairs(extra or {}) do keys[k] = true end
  check.keys(o, keys, what .. ' options', 'INVALID_INPUT', 4)
  local out = {}
  if o.x == nil and o.y == nil and optional then return out end
  out.x, out.y = coordinate(o.x, 'x'), coordinate(o.y, 'y')
  return out
end

local function button(o, out)
  if o.button ~= nil and not BUTTONS[o.button] then
    errors.raise('INVALID_INPUT', "button must be 'left', 'right' or 'middle'", nil, 4)
  end
  out.button = o.button or 'left'
  return out
end

--- The screen as PNG bytes.
function Desktop:screenshot()
  local png = self:_call(0, 'screenshot')
  if type(png) ~= 'string' or png:sub(1, 8) ~= PNG_SIGNATURE or png:sub(13, 16) ~= 'IHDR' then
    error(bad_reply('screenshot'), 2)
  end
  return png
end

--- `{ x, y, button }`: clicks ('left' by default) at x, y, or where the pointer is without them.
function Desktop:click(o)
  self:_call(0, 'click', button(o, point(o, 'click', { button = true }, true)))
end

--- `{ x, y, button }`: as click, twice.
function Desktop:double_click(o)
  self:_call(0, 'double_click', button(o, point(o, 'double_click', { button = true }, true)))
end

--- `{ x, y }`: moves the pointer.
function Desktop:move(o)
  self:_call(0, 'move', point(o, 'move'))
end

--- `{ direction, amount, x, y }`: scrolls 'up', 'down', 'left' or 'right', `amount` steps (1 by
-- default, at most 100), at x, y when given.
function Desktop:scroll(o)
  local out = point(o, 'scroll', { direction = true, amount = true }, true)
  if not DIRECTIONS[o.direction] then
    errors.raise('INVALID_INPUT', "direction must be 'up', 'down', 'left' or 'right'", nil, 2)
  end
  out.direction = o.direction
  out.amount = check.int(o.amount, 'amount', 1, 100, 'INVALID_INPUT', 3, 1)
  self:_call(0, 'scroll', out)
end

--- `{ from = { x, y }, to = { x, y }, button }`: presses at `from`, moves to `to` and lets go there.
function Desktop:drag(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'drag expects a table', nil, 2) end
  check.keys(o, { from = true, to = true, button = true }, 'drag options', 'INVALID_INPUT', 3)
  local out = button(o, {})
  out.from, out.to = point(o.from, 'drag.from'), point(o.to, 'drag.to')
  self:_call(0, 'drag', out)
end

--- Types text (at most 64 KiB, no NUL byte).
function Desktop:type(text)
  if type(text) ~= 'string' then errors.raise('INVALID_INPUT', 'text must be a string', nil, 2) end
  if text:find('\0', 1, true) then errors.raise('INVALID_INPUT', 'text contains a NUL byte', nil, 2) end
  if #text > MAX_TYPE_BYTES then
    errors.raise('INVALID_INPUT', 'text is longer than ' .. MAX_TYPE_BYTES .. ' bytes', nil, 2)
  end
  self:_call(#text * TYPE_MS_PER_BYTE, 'type', text)
end

--- Presses a key or a combination: 'Return', 'Enter', 'ctrl+c', 'shift+Tab', 'F5'.
function Desktop:key(name)
  local ok = type(name) == 'string' and #name >= 1 and #name <= 64
  if ok then
    for part in (name .. '+'):gmatch('([^+]*)%+') do ok = ok and part:match('^[%w_]+$') ~= nil end
  end
  if not ok then
    errors.raise('INVALID_INPUT', 'key must be a key name or names joined by + (letters, digits and _)', nil, 2)
  end
  self:_call(0, 'key', name)
end

--- `{ width, height }` of the screen.
function Desktop:size()
  local s = self:_call(0, 'size')
  if type(s) ~= 'table' or not check.is_int(s.width) or not check.is_int(s.height) or s.width < 1
    or s.height < 1 then
    error(bad_reply('screen size'), 2)
  end
  return { width = s.width, height = s.height }
end

--- The URL of a live view of the desktop, on providers that give one (INVALID_INPUT elsewhere).
-- `options` (a table, or nil) goes to the provider: `{ view_only = true }` for a view that cannot act.
function Desktop:view_url(options)
  alive(self._sandbox)
  if options ~= nil then
    check.keys(options, { view_only = true }, 'view_url options', 'INVALID_INPUT', 3)
    if options.view_only ~= nil and type(options.view_only) ~= 'boolean' then
      errors.raise('INVALID_INPUT', 'view_only must be a boolean', nil, 2)
    end
  end
  local d = self._sandbox._backend.desktop
  if type(d.view_url) ~= 'function' then
    errors.raise('INVALID_INPUT', 'this provider gives no live view of its desktop', nil, 2)
  end
  local url = self:_call(0, 'view_url', options)
  if type(url) ~= 'string' or not url:match('^https?://') then error(bad_reply('URL'), 2) end
  return url
end

M.new = new_desktop

return M
