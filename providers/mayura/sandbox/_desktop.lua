--- mayura.sandbox._desktop: a desktop in a sandbox whose commands run through the agent.
--
-- Shared by the local and Docker providers. The desktop is an X server in the
-- sandbox itself: Xvfb (no GPU, no window manager), driven with xdotool, and
-- seen through xwd, whose picture netpbm's xwdtopnm and pnmtopng turn into a
-- PNG. Every action is one command through the agent, so it runs as the
-- sandbox's user, under its limits, and ends with it.
--
--   local desktop = require('mayura.sandbox._desktop')
--   p.desktop = desktop.settings(options.desktop, 'local', root)   -- the provider's option
--   env = desktop.env(self.desktop, spec, env)                     -- DISPLAY for every command
--   if spec.desktop then desktop.attach(backend, self.desktop) end   -- after the handshake
--
-- The X server is started at create, when the sandbox is asked for with
-- `desktop = true`: `setsid Xvfb :<display> -screen 0 <width>x<height>x24
-- -nolisten tcp -noreset -extension GLX`, in a session of its own so that it
-- outlives the command that starts it (it ends with the sandbox). The command
-- waits until the server says it is ready (-displayfd, on a fifo), never by
-- polling. It listens on /tmp/.X11-unix/X<display> (the sandbox's own /tmp)
-- and on the abstract socket of the same name in the sandbox's own network
-- namespace; never on TCP. Anything in the sandbox may use it, as it may run
-- any command; nothing outside it can reach it.
--
-- The programs come from the sandbox's root: the host's /usr on the local
-- provider, the image on Docker. An image without them fails the create with
-- INVALID_INPUT, saying which are missing.
--
-- `backend.desktop` takes arguments the pool has checked (x, y whole numbers
-- from 0, a button, a direction, text without NUL, a key name of letters,
-- digits, _ and +); what comes back from the sandbox is checked here and again
-- by the pool. There is no live view (`view_url`): the pool says so.
local errors = require('mayura.errors')
local check = require('mayura._check')
local host = require('mayura.sandbox._host')

local M = {}

M.PROGRAMS = { 'Xvfb', 'xkbcomp', 'xdotool', 'xwd', 'xwdtopnm', 'pnmtopng', 'setsid', 'mkfifo' }
M.DEFAULTS = { display = 0, width = 1024, height = 768 }

local MIB = 1048576
local START_TIMEOUT_MS = 20000
local ACTION_TIMEOUT_MS = 10000
local TYPE_DELAY_MS = 8                 -- between two typed characters (xdotool's own default is 12)
local MAX_SCREENSHOT_BYTES = 64 * MIB
local PNG_SIGNATURE = '\137PNG\r\n\26\n'
local DIR = '/tmp/.mayura-desktop'      -- the server's log and its ready fifo
-- where the providers' roots keep programs (the local provider's sandboxes see the host's /usr)
local BIN_DIRS = { '/usr/local/bin', '/usr/bin', '/bin', '/usr/sbin', '/sbin' }

local BUTTONS = { left = 1, middle = 2, right = 3 }
local WHEEL = { up = 4, down = 5, left = 6, right = 7 }

-- Common key names as X keysyms (any other name goes to xdotool as it is: `a`, `Return`, `F5`).
local KEYS = {
  enter = 'Return', ['return'] = 'Return', esc = 'Escape', escape = 'Escape', backspace = 'BackSpace',
  tab = 'Tab', space = 'space', delete = 'Delete', del = 'Delete', insert = 'Insert', home = 'Home',
  ['end'] = 'End', pageup = 'Page_Up', page_up = 'Page_Up', pagedown = 'Page_Down', page_down = 'Page_Down',
  up = 'Up', down = 'Down', left = 'Left', right = 'Right', ctrl = 'ctrl', control = 'ctrl', alt = 'alt',
  shift = 'shift', super = 'super', meta = 'meta', cmd = 'super', command = 'super', win = 'super',
  capslock = 'Caps_Lock', caps_lock = 'Caps_Lock', printscreen = 'Print', print = 'Print',
}
for i = 1, 24 do KEYS['f' .. i] = 'F' .. i end

-- {======================================================
-- Settings
-- =======================================================

local setting_keys = { display = true, width = true, height = true }

--- The provider's `desktop` option as settings `{ display, width, height }`, or nil for no desktop.
-- `value`: nil (`auto_found` decides: the local provider offers a desktop when the programs are
-- there), false (none), true (the defaults) or a table of `display` (0..99, 0 by default), `width`
-- and `height` (64..8192, 1024 x 768 by default). `root` is where the programs are looked for, when
-- the provider knows (nil: not checked, as for an image).
function M.settings(value, root, level)
  level = (level or 2) + 1
  local C = 'INVALID_CONFIG'
  if value == false then return nil end
  local missing = root and M.missing_programs(root) or {}
  if value == nil then
    if not root or #missing > 0 then return nil end
    value = true
  end
  if value == true then value = {} end
  if type(value) ~= 'table' then errors.raise(C, 'desktop must be a boolean or a table of settings', nil, level) end
  check.keys(value, setting_keys, 'desktop', C, level)
  local s = {
    display = check.int(value.display, 'desktop.display', 0, 99, C, level, M.DEFAULTS.display),
    width = check.int(value.width, 'desktop.width', 64, 8192, C, level, M.DEFAULTS.width),
    height = check.int(value.height, 'desktop.height', 64, 8192, C, level, M.DEFAULTS.height),
  }
  if #missing > 0 then
    errors.raise(C, 'a desktop needs ' .. table.concat(missing, ', ') .. ' (see scripts/setup.sh)', nil, level)
  end
  return s
end

--- The programs of M.PROGRAMS not found under `root` ('' for the host).
function M.missing_programs(root)
  local out = {}
  for _, name in ipairs(M.PROGRAMS) do
    local found = false
    for _, dir in ipairs(BIN_DIRS) do
      if host.exists(root .. dir .. '/' .. name) then found = true break end
    end
    if not found then out[#out + 1] = name end
  end
  return out
end

--- `env` (what commands are to see, may be nil) with DISPLAY naming the sandbox's desktop, when
-- it has one; a DISPLAY in the create's own env (`spec.env`) is kept, one of an image is not.
function M.env(settings, spec, env)
  if not settings or not spec.desktop then return env end
  local out = {}
  for k, v in pairs(env or {}) do out[k] = v end
  if not (spec.env and spec.env.DISPLAY) then out.DISPLAY = ':' .. settings.display end
  return out
end

-- }======================================================

-- {======================================================
-- The desktop of one sandbox
-- =======================================================

-- $1 display, $2 screen (WxHx24). Exit 3 with the missing programs, 4 when the fifo cannot be made,
-- 5 when the server did not get ready.
local START = [[
missing=
for p in ]] .. table.concat(M.PROGRAMS, ' ') .. [[; do
  command -v "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then echo "missing$missing"; exit 3; fi
dir=]] .. DIR .. [[

mkdir -p "$dir" && rm -f "$dir/ready" && mkfifo -m 600 "$dir/ready" || exit 4
setsid Xvfb ":$1" -screen 0 "$2" -nolisten tcp -noreset -extension GLX -displayfd 3 \
  3>"$dir/ready" </dev/null >"$dir/log" 2>&1 &
n=
read -r n <"$dir/ready"
rm -f "$dir/ready"
[ "$n" = "$1" ] || exit 5
echo ready
]]

local Desktop = {}
Desktop.__index = Desktop

-- Runs argv on the desktop; returns stdout. A failure is SANDBOX_ERROR (`timeout` at the timeout).
function Desktop:_run(argv, what, timeout_ms, max_output)
  local r = self.backend:exec(argv, {
    timeout_ms = timeout_ms or ACTION_TIMEOUT_MS,
    max_output_bytes = max_output or 65536,
    env = { DISPLAY = self.display },
  })
  if r.timed_out then error(errors.sandbox('timeout', 'the desktop did not ' .. what .. ' in time'), 0) end
  if r.exit_code ~= 0 or r.truncated then
    error(errors.sandbox('failed', 'the desktop could not ' .. what), 0)
  end
  return r.stdout
end

local function xdotool(...)
  local argv = { 'xdotool' }
  for _, a in ipairs({ ... }) do argv[#argv + 1] = tostring(a) end
  return argv
end

local function extend(argv, ...)
  for _, a in ipairs({ ... }) do argv[#argv + 1] = tostring(a) end
  return argv
end

--- The whole screen as PNG bytes.
function Desktop:screenshot()
  local png = self:_run({ 'sh', '-c', 'xwd -root -silent | xwdtopnm 2>/dev/null | pnmtopng 2>/dev/null' },
    'take a screenshot', nil, MAX_SCREENSHOT_BYTES)
  if png:sub(1, 8) ~= PNG_SIGNATURE or png:sub(13, 16) ~= 'IHDR' then
    error(errors.sandbox('failed', 'the desktop\'s screenshot is not a PNG'), 0)
  end
  return png
end

-- `xdotool [mousemove x y] click --repeat n --delay ms button` (xdotool waits the delay after the
-- last click too, 100 ms unless told: none for one click)
local function click_argv(o, button, times, delay_ms)
  local argv = xdotool()
  if o.x ~= nil then extend(argv, 'mousemove', o.x, o.y) end
  return extend(argv, 'click', '--repeat', times, '--delay', times > 1 and delay_ms or 0, button)
end

--- `{ x, y, button }`: a click ('left' by default), where the pointer is when x and y are not given.
function Desktop:click(o)
  self:_run(click_argv(o, BUTTONS[o.button or 'left'], 1), 'click')
end

function Desktop:double_click(o)
  self:_run(click_argv(o, BUTTONS[o.button or 'left'], 2, 60), 'double-click')
end

function Desktop:move(o)
  self:_run(xdotool('mousemove', o.x, o.y), 'move the pointer')
end

--- `{ direction, amount, x, y }`: `amount` turns of the wheel (1 by default), at x, y when given.
function Desktop:scroll(o)
  self:_run(click_argv(o, WHEEL[o.direction], o.amount or 1, 20), 'scroll')
end

--- `{ from = { x, y }, to = { x, y }, button }`: presses at `from`, moves to `to`, releases there.
function Desktop:drag(o)
  local b = BUTTONS[o.button or 'left']
  self:_run(xdotool('mousemove', o.from.x, o.from.y, 'mousedown', b, 'sleep', 0.05, 'mousemove', o.to.x, o.to.y,
    'sleep', 0.05, 'mouseup', b), 'drag')
end

function Desktop:type(text)
  if text == '' then return end
  self:_run(xdotool('type', '--delay', TYPE_DELAY_MS, '--', text), 'type',
    ACTION_TIMEOUT_MS + #text * (TYPE_DELAY_MS + 20))
end

--- A key or a combination: `Return`, `ctrl+c`, `Enter`, `shift+Tab` (common names map to keysyms).
function Desktop:key(name)
  local parts = {}
  for part in name:gmatch('[^+]+') do parts[#parts + 1] = KEYS[part:lower()] or part end
  self:_run(xdotool('key', '--', table.concat(parts, '+')), 'press ' .. name)
end

--- `{ width, height }` of the screen, as the X server says.
function Desktop:size()
  local out = self:_run(xdotool('getdisplaygeometry'), 'tell its size')
  local w, h = out:match('^(%d+) (%d+)%s*$')
  w, h = tonumber(w), tonumber(h)
  if not w or not h or w < 1 or h < 1 then error(errors.sandbox('failed', 'the desktop gave no size'), 0) end
  return { width = math.floor(w), height = math.floor(h) }
end

--- Starts the desktop of a new sandbox (`backend` has `exec`); returns the desktop. A root without
-- the programs is INVALID_INPUT; a server that does not start is SANDBOX_ERROR.
function M.start(backend, settings)
  local d = setmetatable({ backend = backend, display = ':' .. settings.display }, Desktop)
  local screen = ('%dx%dx24'):format(settings.width, settings.height)
  local r = backend:exec({ 'sh', '-c', START, 'mayura-desktop', tostring(settings.display), screen }, {
    timeout_ms = START_TIMEOUT_MS, max_output_bytes = 4096, env = { DISPLAY = d.display },
  })
  if r.exit_code == 3 then
    -- only names of our own list are repeated, never the sandbox's words
    local missing = {}
    for _, name in ipairs(M.PROGRAMS) do
      if (' ' .. r.stdout .. ' '):find('%s' .. name .. '%s') then missing[#missing + 1] = name end
    end
    errors.raise('INVALID_INPUT', 'this image has no desktop: it lacks ' .. table.concat(missing, ', '), nil, 0)
  end
  if r.timed_out then error(errors.sandbox('timeout', 'the desktop did not start in time'), 0) end
  if r.exit_code ~= 0 or r.stdout ~= 'ready\n' then
    error(errors.sandbox('failed', 'the desktop did not start (see ' .. DIR .. '/log in the sandbox)'), 0)
  end
  return d
end

--- Starts the desktop of `backend` as `backend.desktop`.
function M.attach(backend, settings)
  backend.desktop = M.start(backend, settings)
end

-- }======================================================

return M
