--- mayura.sandbox._daytona_desktop: the desktop of a Daytona sandbox (Daytona's computer use,
-- /computeruse/* of its toolbox), `backend.desktop` of mayura.sandbox.daytona with `desktop = true`.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local toolbox = require('mayura.sandbox._daytona_toolbox')

local M = {}

local json, b64 = core.json, core.base64
local gone = toolbox.gone
local DESKTOP_PORT = 6080

-- {======================================================
-- The desktop (Daytona's computer use)
-- =======================================================

local Desktop = {}
Desktop.__index = Desktop

local BUTTONS = { left = true, right = true, middle = true }
local DIRECTIONS = { up = true, down = true, left = true, right = true }
local MODIFIERS = { ctrl = 'ctrl', control = 'ctrl', alt = 'alt', shift = 'shift', cmd = 'cmd', super = 'cmd',
  meta = 'cmd', win = 'cmd' }
local PNG = '\137PNG\r\n\26\n'

local function xy(v, name)
  return check.int(v, name, 0, 100000, 'INVALID_INPUT', 4)
end

function Desktop:_call(method, path, body)
  local b = self._b
  if b._closed or core.hrtime_ms() >= b._expires_at then error(gone(), 0) end
  return b:_toolbox('json', method, path, body)
end

function Desktop:screenshot()
  local body = self:_call('GET', '/computeruse/screenshot')
  local data = type(body) == 'table' and type(body.screenshot) == 'string' and b64.decode(body.screenshot)
  if not data or data:sub(1, 8) ~= PNG then error(self._b._tb:bad_answer('a screenshot that is not a PNG'), 0) end
  return data
end

function Desktop:click(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'click takes { x, y, button }', nil, 2) end
  local button = o.button or 'left'
  if not BUTTONS[button] then errors.raise('INVALID_INPUT', "button must be 'left', 'right' or 'middle'", nil, 2) end
  self:_call('POST', '/computeruse/mouse/click', { x = xy(o.x, 'x'), y = xy(o.y, 'y'), button = button,
    double = o.double == true })
end

function Desktop:double_click(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'double_click takes { x, y }', nil, 2) end
  self:click({ x = o.x, y = o.y, button = o.button, double = true })
end

function Desktop:move(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'move takes { x, y }', nil, 2) end
  self:_call('POST', '/computeruse/mouse/move', { x = xy(o.x, 'x'), y = xy(o.y, 'y') })
end

function Desktop:drag(o)
  if type(o) ~= 'table' or type(o.from) ~= 'table' or type(o.to) ~= 'table' then
    errors.raise('INVALID_INPUT', 'drag takes { from = { x, y }, to = { x, y } }', nil, 2)
  end
  local button = o.button or 'left'
  if not BUTTONS[button] then errors.raise('INVALID_INPUT', "button must be 'left', 'right' or 'middle'", nil, 2) end
  self:_call('POST', '/computeruse/mouse/drag', { startX = xy(o.from.x, 'from.x'), startY = xy(o.from.y, 'from.y'),
    endX = xy(o.to.x, 'to.x'), endY = xy(o.to.y, 'to.y'), button = button })
end

function Desktop:scroll(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'scroll takes { direction, amount, x, y }', nil, 2) end
  if not DIRECTIONS[o.direction] then
    errors.raise('INVALID_INPUT', "direction must be 'up', 'down', 'left' or 'right'", nil, 2)
  end
  local amount = check.int(o.amount, 'amount', 1, 100, 'INVALID_INPUT', 3, 1)
  local x, y = o.x, o.y
  if x == nil or y == nil then
    local at = self:_call('GET', '/computeruse/mouse/position')
    x, y = type(at) == 'table' and at.x, type(at) == 'table' and at.y
    if not check.is_int(x) or not check.is_int(y) then error(self._b._tb:bad_answer('a mouse position'), 0) end
  end
  self:_call('POST', '/computeruse/mouse/scroll', { x = xy(x, 'x'), y = xy(y, 'y'), direction = o.direction,
    amount = amount })
end

function Desktop:type(text)
  if type(text) ~= 'string' or #text > 100000 or text:find('%z') then
    errors.raise('INVALID_INPUT', 'type takes a string without NUL bytes (at most 100000 bytes)', nil, 2)
  end
  self:_call('POST', '/computeruse/keyboard/type', { text = text })
end

--- A key, or a chord such as 'ctrl+c' or 'ctrl+shift+t'.
function Desktop:key(name)
  if type(name) ~= 'string' or #name == 0 or #name > 64 or not name:match('^[%w_+%-]+$') then
    errors.raise('INVALID_INPUT', "key takes a key name such as 'Return' or 'ctrl+c'", nil, 2)
  end
  local parts = {}
  for p in name:gmatch('[^+]+') do parts[#parts + 1] = p end
  if #parts == 0 then errors.raise('INVALID_INPUT', 'key takes a key name', nil, 2) end
  local mods = setmetatable({}, json.array_mt)
  for i = 1, #parts - 1 do
    local m = MODIFIERS[parts[i]:lower()]
    if not m then errors.raise('INVALID_INPUT', 'unknown modifier ' .. parts[i], nil, 2) end
    mods[#mods + 1] = m
  end
  self:_call('POST', '/computeruse/keyboard/key', { key = parts[#parts], modifiers = mods })
end

--- The screen's size, `{ width, height }`.
function Desktop:size()
  local body = self:_call('GET', '/computeruse/display/info')
  local displays = type(body) == 'table' and body.displays
  local d = type(displays) == 'table' and displays[1]
  if type(displays) == 'table' then
    for _, x in ipairs(displays) do
      if type(x) == 'table' and x.isActive then d = x break end
    end
  end
  if type(d) ~= 'table' or not check.is_int(d.width) or not check.is_int(d.height) then
    error(self._b._tb:bad_answer('display information'), 0)
  end
  return { width = d.width, height = d.height }
end

--- A URL of the desktop's live view in a browser (noVNC), signed.
function Desktop:view_url()
  local b = self._b
  if b._closed then error(gone(), 0) end
  return b:url(DESKTOP_PORT):gsub('/+$', '') .. '/vnc.html'
end

-- }======================================================

--- Starts the desktop of the toolbox backend `b` and returns it (SANDBOX_ERROR `failed` when the
-- snapshot has none).
function M.start(b)
  local ok, err = pcall(b._toolbox, b, 'json', 'POST', '/computeruse/start', nil)
  if not ok then
    local e = toolbox.failed('the desktop did not start (does the snapshot have one?)')
    e.cause = err
    error(e, 0)
  end
  return setmetatable({ _b = b }, Desktop)
end

return M
