--- mayura.sandbox.e2b_desktop: E2B sandboxes with an Xfce desktop (the `desktop`
-- template), driven as the official @e2b/desktop SDK drives it.
--
--   local d = require('mayura.sandbox.e2b_desktop')
--   local pool = sandbox.create_sandboxes(d.e2b_desktop_sandboxes({ api_key = key }), { ... })
--   local sb = pool:create({ lifetime_ms = 600000 })
--   local png = sb.desktop:screenshot()
--   sb.desktop:click({ x = 100, y = 200 })
--
-- Everything mayura.sandbox.e2b does, with its options, plus:
--   template     'desktop' by default (Xvfb, Xfce, xdotool, scrot, x11vnc, noVNC)
--   resolution   { width, height } of the screen ({ 1024, 768 })
--   dpi          the screen's dots per inch (96)
--   view_auth    whether the live view needs a password (true: view_url then holds one)
--
-- There is no desktop API at E2B: every action is a command in the sandbox
-- (process.Process/Start of `/bin/bash -l -c ...`), as the SDK sends them. A
-- create starts the display (`Xvfb :0 ...`, left running, then polls
-- `xdpyinfo` for up to 10 s) and Xfce (`startxfce4`, then polls pgrep for up to
-- 60 s); a sandbox whose desktop does not come up is killed, and the create
-- fails with SANDBOX_ERROR `failed`. Every command gets DISPLAY=:0.
--
-- `sandbox.desktop`:
--   screenshot()                   the screen as PNG bytes (`scrot --pointer`, read, removed)
--   click{ x, y, button }          moves there (always: the SDK skips a move at 0), then clicks
--                                  'left' (default), 'right' or 'middle'
--   double_click{ x, y }           moves there, then two left clicks
--   move{ x, y }                   moves the pointer
--   scroll{ direction, amount, x, y }  'up', 'down' (default), 'left' or 'right', `amount`
--                                  steps (1), at x, y when given
--   type(text)                     types text, 25 characters a command (xdotool type)
--   key(name)                      presses a key or a chord: 'enter', 'Escape', 'ctrl+c'
--   drag{ from = { x, y }, to = { x, y } }  presses the left button at one point, lets go at the
--                                  other (a point is { x = .., y = .. } or { x, y })
--   size()                         { width, height } of the screen (xrandr)
--   view_url{ view_only }          the noVNC live view's URL (starts x11vnc and noVNC the first
--                                  time): https://6080-<id>.<domain>/vnc.html?...
-- Coordinates are whole numbers from 0; key names are letters, digits and `_`
-- joined by `+` (so nothing of a name reaches the shell unchecked). A failed
-- action is SANDBOX_ERROR `failed`; after release or the lifetime, `gone`.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local scripts = require('mayura.sandbox.scripts')
local e2b = require('mayura.sandbox._e2b')
local kit = require('mayura.sandbox._kit')

local M = {}

M.FEATURES = { stdin = true, ports = true, desktop = true, network = { 'none', 'all', 'allowlist' } }

local DISPLAY = ':0'
local VNC_PORT, VIEW_PORT = 5900, 6080
local TYPE_CHUNK, TYPE_DELAY_MS = 25, 75
local PNG_SIGNATURE = '\137PNG\r\n\26\n'
local MAX_TEXT = 100000

-- Key names people write, as X keysyms; other names go as they are, lower-cased when they are
-- one of the names here in another case.
local KEYSYMS = {
  enter = 'Return', ['return'] = 'Return', esc = 'Escape', escape = 'Escape', tab = 'Tab', space = 'space',
  backspace = 'BackSpace', delete = 'Delete', del = 'Delete', insert = 'Insert', home = 'Home', ['end'] = 'End',
  page_up = 'Page_Up', pageup = 'Page_Up', page_down = 'Page_Down', pagedown = 'Page_Down',
  up = 'Up', down = 'Down', left = 'Left', right = 'Right',
  ctrl = 'Control_L', control = 'Control_L', control_right = 'Control_R', alt = 'Alt_L', alt_right = 'Alt_R',
  shift = 'Shift_L', shift_right = 'Shift_R', meta = 'Meta_L', super = 'Super_L', cmd = 'Super_L',
  command = 'Super_L', win = 'Super_L', windows = 'Super_L', menu = 'Menu', caps_lock = 'Caps_Lock',
  num_lock = 'Num_Lock', scroll_lock = 'Scroll_Lock', print = 'Print', pause = 'Pause',
}
for i = 1, 12 do KEYSYMS['f' .. i] = 'F' .. i end

local BUTTONS = { left = 1, middle = 2, right = 3 }
local SCROLL = { up = 4, down = 5, left = 6, right = 7 }

-- {======================================================
-- The desktop of one sandbox
-- =======================================================

local Desktop = {}
Desktop.__index = Desktop

local function coord(v, name)
  return check.int(v, name, 0, 65535, 'INVALID_INPUT', 4)
end

-- { x = .., y = .. } or { x, y }
local function point(o, what)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', what .. ' needs a table with x and y', nil, 3) end
  local x, y = o.x, o.y
  if x == nil and y == nil then x, y = o[1], o[2] end
  return coord(x, what .. '.x'), coord(y, what .. '.y')
end

-- Runs a desktop command; a command that fails is SANDBOX_ERROR `failed`.
function Desktop:_run(command)
  local r = self._backend:shell(command)
  if r.exit_code ~= 0 then
    error(errors.sandbox('failed', 'e2b-desktop: a desktop command failed in the sandbox'), 0)
  end
  return r
end

function Desktop:_move(x, y)
  self:_run(string.format('xdotool mousemove --sync %d %d', x, y))
end

--- The screen as PNG bytes.
function Desktop:screenshot()
  local path = '/tmp/screenshot-' .. kit.random_hex(8) .. '.png'
  self:_run('scrot --pointer ' .. path)
  local png = self._backend:read_file(path, { max_bytes = 64 * 1048576 })
  pcall(self._backend.remove_file, self._backend, path, { recursive = true })
  if type(png) ~= 'string' or png:sub(1, 8) ~= PNG_SIGNATURE then
    error(errors.sandbox('failed', 'e2b-desktop: the screenshot is not a PNG'), 0)
  end
  return png
end

--- Clicks at { x, y } with `button` ('left', 'right' or 'middle').
function Desktop:click(o)
  local x, y = point(o, 'click')
  local button = BUTTONS[o.button or 'left']
  if not button then errors.raise('INVALID_INPUT', "button must be 'left', 'right' or 'middle'", nil, 2) end
  self:_move(x, y)
  self:_run('xdotool click ' .. button)
end

--- Two left clicks at { x, y }.
function Desktop:double_click(o)
  local x, y = point(o, 'double_click')
  self:_move(x, y)
  self:_run('xdotool click --repeat 2 1')
end

--- Moves the pointer to { x, y }.
function Desktop:move(o)
  local x, y = point(o, 'move')
  self:_move(x, y)
end

--- Scrolls { direction = 'up'|'down'|'left'|'right', amount = steps, x, y }.
function Desktop:scroll(o)
  o = o or {}
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'scroll needs a table', nil, 2) end
  local button = SCROLL[o.direction or 'down']
  if not button then errors.raise('INVALID_INPUT', "direction must be 'up', 'down', 'left' or 'right'", nil, 2) end
  local amount = check.int(o.amount, 'amount', 1, 1000, 'INVALID_INPUT', 2, 1)
  if o.x ~= nil or o.y ~= nil then self:_move(point(o, 'scroll')) end
  self:_run(string.format('xdotool click --repeat %d %d', amount, button))
end

--- Types `text`, in chunks of 25 characters.
function Desktop:type(text)
  if type(text) ~= 'string' then errors.raise('INVALID_INPUT', 'text must be a string', nil, 2) end
  if #text > MAX_TEXT then errors.raise('INVALID_INPUT', 'text is longer than ' .. MAX_TEXT .. ' bytes', nil, 2) end
  if text:find('%z') then errors.raise('INVALID_INPUT', 'text contains a NUL byte', nil, 2) end
  local chars = {}
  for c in text:gmatch('[%z\1-\127\192-\255][\128-\191]*') do chars[#chars + 1] = c end
  for i = 1, #chars, TYPE_CHUNK do
    local chunk = table.concat(chars, '', i, math.min(i + TYPE_CHUNK - 1, #chars))
    self:_run(string.format('xdotool type --delay %d -- %s', TYPE_DELAY_MS, scripts.quote(chunk)))
  end
end

--- Presses a key or a chord ('enter', 'ctrl+c').
function Desktop:key(name)
  if type(name) ~= 'string' or #name > 64 then errors.raise('INVALID_INPUT', 'a key must be a short string', nil, 2) end
  local keys = {}
  for part in (name .. '+'):gmatch('([^+]*)%+') do
    if not part:match('^[%w_]+$') then
      errors.raise('INVALID_INPUT', 'a key is letters, digits and _, or such names joined by +', nil, 2)
    end
    keys[#keys + 1] = KEYSYMS[part:lower()] or part
  end
  self:_run('xdotool key ' .. table.concat(keys, '+'))
end

--- Presses the left button at `from` ({ x, y }) and lets it go at `to`.
function Desktop:drag(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'drag needs { from = { x, y }, to = { x, y } }', nil, 2) end
  local x1, y1 = point(o.from, 'drag.from')
  local x2, y2 = point(o.to, 'drag.to')
  self:_move(x1, y1)
  self:_run('xdotool mousedown 1')
  self:_move(x2, y2)
  self:_run('xdotool mouseup 1')
end

--- { width, height } of the screen.
function Desktop:size()
  local r = self:_run('xrandr')
  local w, h = r.stdout:match('(%d+)x(%d+)')
  if not w then error(errors.sandbox('failed', 'e2b-desktop: the screen size could not be read'), 0) end
  return { width = tonumber(w), height = tonumber(h) }
end

-- Polls `command` (every 500 ms, up to `ms`) until it exits 0, or `pred(result)` holds.
local function wait_for(backend, command, ms, pred)
  local deadline = core.hrtime_ms() + ms
  while true do
    local r = backend:shell(command)
    if r.exit_code == 0 and (not pred or pred(r)) then return true end
    if core.hrtime_ms() + 500 > deadline then return false end
    task.sleep(500)
  end
end

local ALNUM = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789'

local function password()
  local hex = kit.random_hex(16)
  local out = {}
  for i = 1, 16 do
    local n = tonumber(hex:sub(2 * i - 1, 2 * i), 16) % #ALNUM + 1
    out[i] = ALNUM:sub(n, n)
  end
  return table.concat(out)
end

-- Starts x11vnc and noVNC, as the SDK's stream.start does.
function Desktop:_start_view()
  local pw
  if self._view_auth then
    pw = password()
    self:_run('mkdir -p ~/.vnc')
    self:_run('x11vnc -storepasswd ' .. pw .. ' ~/.vnc/passwd')
  end
  self:_run(string.format('x11vnc -bg -display %s -forever -wait 50 -shared -rfbport %d %s 2>/tmp/x11vnc_stderr.log',
    DISPLAY, VNC_PORT, pw and '-usepw' or '-nopw'))
  self._backend:background(string.format('cd /opt/noVNC/utils && ./novnc_proxy --vnc localhost:%d --listen %d '
    .. '--web /opt/noVNC > /tmp/novnc.log 2>&1', VNC_PORT, VIEW_PORT))
  local up = wait_for(self._backend, string.format('netstat -tuln | grep ":%d "', VIEW_PORT), 10000,
    function(r) return r.stdout:find('%S') ~= nil end)
  if not up then error(errors.sandbox('failed', 'e2b-desktop: the live view did not start'), 0) end
  return { password = pw }
end

--- The live view's URL; `{ view_only = true }` for one that cannot act.
function Desktop:view_url(o)
  o = o or {}
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'view_url takes a table of options', nil, 2) end
  check.keys(o, { view_only = true }, 'view_url options', 'INVALID_INPUT', 2)
  self._backend:_alive()
  if not self._view then
    if not self._view_task then
      self._view_task = task.spawn(function() return self:_start_view() end)
    end
    local t = self._view_task
    local ok, v = pcall(t.wait, t)
    if not ok then
      if self._view_task == t then self._view_task = nil end
      error(v, 0)
    end
    self._view = v
  end
  local b = self._backend
  local url = string.format('https://%d-%s.%s/vnc.html?autoconnect=true', VIEW_PORT, b.id, b.domain)
  if o.view_only then url = url .. '&view_only=true' end
  url = url .. '&resize=scale'
  if self._view.password then url = url .. '&password=' .. self._view.password end
  return url
end

-- }======================================================

-- The desktop's own options, as kit checkers.
local extra_keys = {
  resolution = function(v, label)
    v = v or { 1024, 768 }
    if type(v) ~= 'table' then
      errors.raise('INVALID_CONFIG', label .. ': resolution must be { width, height }', nil, 0)
    end
    return { check.int(v[1], 'resolution[1]', 64, 16384, 'INVALID_CONFIG', 0),
      check.int(v[2], 'resolution[2]', 64, 16384, 'INVALID_CONFIG', 0) }
  end,
  dpi = kit.int(24, 1200, 96),
  view_auth = kit.bool(true),
}

--- The provider: mayura.sandbox.e2b's options, with `resolution`, `dpi` and `view_auth`; `warm`
-- sandboxes come with their desktop up.
function M.e2b_desktop_sandboxes(options)
  local config = e2b.config(options, { label = 'e2b-desktop', template = 'desktop' }, extra_keys)
  local width, height, dpi, view_auth = config.resolution[1], config.resolution[2], config.dpi, config.view_auth
  local features = { network = {} }
  for k, v in pairs(M.FEATURES) do if k ~= 'network' then features[k] = v end end
  for i, kind in ipairs(M.FEATURES.network) do features.network[i] = kind end

  local function after_create(backend)
    backend:background(string.format('Xvfb %s -ac -screen 0 %dx%dx24 -retro -dpi %d -nolisten tcp -nolisten unix',
      DISPLAY, width, height, dpi))
    if not wait_for(backend, 'xdpyinfo -display ' .. DISPLAY, 10000) then
      error(errors.sandbox('failed', 'e2b-desktop: the display did not start'), 0)
    end
    backend:background('startxfce4')
    if not wait_for(backend, 'pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && '
      .. 'pgrep -x xfdesktop >/dev/null', 60000) then
      error(errors.sandbox('failed', 'e2b-desktop: the desktop did not start'), 0)
    end
    backend.desktop = setmetatable({ _backend = backend, _view_auth = view_auth }, Desktop)
  end

  return e2b.provider(config, {
    id = 'e2b-desktop', features = features, env = { DISPLAY = DISPLAY }, after_create = after_create,
  })
end

M.sandboxes = M.e2b_desktop_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
