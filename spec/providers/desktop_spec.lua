-- The desktop of the local and Docker providers (mayura.sandbox._desktop), on every provider here:
-- an X program (spec/support/desktop_app.c) started in a sandbox created with `desktop = true`
-- shows on its screenshots (PNGs of the screen's size, decoded on the host with netpbm's pngtopnm
-- to read pixels), reacts to clicks and shows typed text; each action reaches it; two sandboxes
-- have desktops of their own; the pool refuses what cannot be done. Then the same through the
-- desktop tools of sandbox_tools in scripted runs: with their grants they drive the program, and
-- without `sandbox:<name>:desktop` the run is blocked and the program sees nothing. Last, the
-- pool's checks in front of any provider's desktop, with the one-file provider of spec/support.
local providers = require('support.providers')
local util = require('support.util')
local mayura = require('mayura')
local sandbox = require('mayura.sandbox')
local testing = require('mayura.testing')
local process = require('mayura.process')
local core = require('mayura.core')

local z = mayura.z

local DESKTOP_IMAGE = 'mayura-test/desktop:1'
local SOURCE = 'spec/support/desktop_app.c'
local W, H = 640, 480                       -- the screen of the spec's sandboxes
local BUTTON = { x = 80, y = 45 }            -- inside desktop_app's button (20..139, 20..69)
local TEXT_AREA = { x0 = 20, y0 = 80, x1 = 300, y1 = 100 }   -- where it draws the typed text
local LOG = '/tmp/app.log'
local BLUE, GREEN, WHITE, BLACK = '0,0,255', '0,255,0', '255,255,255', '0,0,0'

-- {======================================================
-- The X program and the pictures
-- =======================================================

local app_bytes
-- desktop_app built on the host (for the local provider, whose sandboxes see the host's libraries).
local function app_binary()
  if app_bytes then return app_bytes end
  local dir = util.tmpdir()
  local out = dir .. '/desktop_app'
  local ok = os.execute('cc -O2 -o ' .. out .. ' ' .. SOURCE .. ' -lX11 2>' .. dir .. '/cc.log')
  local f = io.open(out, 'rb')
  if not ok or not f then
    local log = io.open(dir .. '/cc.log'):read('a')
    util.rmdir(dir)
    error('cannot build ' .. SOURCE .. ' (cc and libx11-dev are needed): ' .. log, 0)
  end
  app_bytes = f:read('a')
  f:close()
  util.rmdir(dir)
  return app_bytes
end

-- Width and height from a PNG's IHDR.
local function png_size(png)
  assert.are.equal('\137PNG\r\n\26\n', png:sub(1, 8))
  assert.are.equal('IHDR', png:sub(13, 16))
  local function u32(i)
    local a, b, c, d = png:byte(i, i + 3)
    return ((a * 256 + b) * 256 + c) * 256 + d
  end
  return u32(17), u32(21)
end

-- The PNG's pixels, decoded by pngtopnm on the host: `at(x, y)` gives 'r,g,b'.
local function picture(png)
  -- pngtopnm keeps a black and white picture as PBM: ppmtoppm makes every picture PPM
  local r = process.run({ 'sh', '-c', 'pngtopnm | ppmtoppm' }, { stdin = png, timeout_ms = 20000, max_output_bytes = 64 * 1048576 })
  assert.are.equal(0, r.exit_code, r.stderr)
  local w, h, max, header_end = r.stdout:match('^P6%s+(%d+)%s+(%d+)%s+(%d+)%s()')
  assert.is_truthy(w, 'pngtopnm wrote no PPM')
  assert.are.equal('255', max)
  local data, width = r.stdout, tonumber(w)
  local pic = { width = width, height = tonumber(h) }
  function pic.at(x, y)
    local i = header_end + (y * width + x) * 3
    local red, green, blue = data:byte(i, i + 2)
    return red .. ',' .. green .. ',' .. blue
  end
  -- whether some pixel of the box has `color`
  function pic.any(box, color)
    for y = box.y0, box.y1 do
      for x = box.x0, box.x1 do
        if pic.at(x, y) == color then return true end
      end
    end
    return false
  end
  return pic
end

-- }======================================================

-- {======================================================
-- Sandboxes with a desktop
-- =======================================================

-- The pool and where desktop_app is for provider entry `p`, or nil and why not.
local function desktop_pool(p, extra)
  local opts = { desktop = { width = W, height = H }, max_sandboxes = 3 }
  for k, v in pairs(extra or {}) do opts[k] = v end
  if p.kind == 'docker' then
    local _, there = providers.host('docker image inspect ' .. DESKTOP_IMAGE)
    if not there then return nil, 'needs ' .. DESKTOP_IMAGE .. ' (scripts/docker-setup.sh)' end
    opts.image = DESKTOP_IMAGE
    return p.make_pool(opts), '/usr/local/bin/desktop_app'
  end
  local ok, pool = pcall(p.make_pool, opts)
  if not ok then return nil, 'needs Xvfb, xdotool, xwd and netpbm on this host (scripts/setup.sh): ' .. tostring(pool) end
  return pool, '/workspace/desktop_app'
end

-- What desktop_app has said so far.
local function app_log(sb)
  return sb:read_file(LOG) or ''
end

-- Waits (up to about 10 s) until desktop_app's output holds the line `line`; returns the output.
local function wait_for(sb, line)
  local log
  for _ = 1, 500 do
    log = app_log(sb)
    if ('\n' .. log):find('\n' .. line .. '\n', 1, true) then return log end
    mayura.sleep(20)
  end
  error('desktop_app never said "' .. line .. '"; it said:\n' .. log, 2)
end

-- Starts desktop_app in the sandbox, out of the command's session, and waits until it shows.
local function start_app(sb, app)
  if app:sub(1, 11) == '/workspace/' then
    sb:write_file(app, app_binary())
    assert.are.equal(0, sb:exec({ 'chmod', '755', app }).exit_code)
  end
  local r = sb:exec({ 'sh', '-c', 'setsid ' .. app .. ' >' .. LOG .. ' 2>&1 </dev/null &' })
  assert.are.equal(0, r.exit_code, r.stderr)
  wait_for(sb, 'ready 320 160')
end

local function count_lines(log, prefix)
  local n = 0
  for line in log:gmatch('[^\n]+') do
    if line:sub(1, #prefix) == prefix then n = n + 1 end
  end
  return n
end

-- }======================================================

local function desktop_specs(p)
  local pool, app = desktop_pool(p)
  if not pool then
    it('shows a desktop', function() pending(app) end)
    return
  end
  teardown(function() pool:close() end)
  -- every sandbox a spec made is released after it, whatever it asserted
  local made = {}
  local function create(opts)
    local sb = pool:create(opts)
    made[#made + 1] = sb
    return sb
  end
  after_each(function()
    for _, sb in ipairs(made) do sb:release() end
    made = {}
  end)

  it('shows an X program on its screenshots; a click and typed text reach it and show', function()
    assert.is_true(pool.provider.features.desktop)
    local sb = create({ lifetime_ms = 120000, desktop = true })
    local d = sb.desktop
    assert.are.same({ width = W, height = H }, d:size())
    -- commands see the display: an X program started with exec shows on the desktop
    assert.are.equal(':0\n', sb:exec({ 'sh', '-c', 'echo "$DISPLAY"' }).stdout)

    local empty = d:screenshot()
    assert.are.same({ W, H }, { png_size(empty) })
    local pic = picture(empty)
    assert.are.same({ W, H }, { pic.width, pic.height })
    assert.are.equal(BLACK, pic.at(BUTTON.x, BUTTON.y))

    start_app(sb, app)
    local shown = d:screenshot()
    assert.are.same({ W, H }, { png_size(shown) })
    assert.are_not.equal(empty, shown)
    pic = picture(shown)
    assert.are.equal(BLUE, pic.at(BUTTON.x, BUTTON.y))       -- the button
    assert.are.equal(WHITE, pic.at(200, 130))                 -- the window
    assert.are.equal(BLACK, pic.at(400, 300))                 -- the screen beyond it
    assert.is_false(pic.any(TEXT_AREA, BLACK))                -- no text yet

    d:click({ x = BUTTON.x, y = BUTTON.y })
    wait_for(sb, 'clicked 1')
    assert.is_truthy(app_log(sb):find('press 1 ' .. BUTTON.x .. ' ' .. BUTTON.y, 1, true))
    assert.are.equal(GREEN, picture(d:screenshot()).at(BUTTON.x, BUTTON.y))

    d:type('Hello, desktop!')
    wait_for(sb, 'text Hello, desktop!')
    d:key('Return')
    wait_for(sb, 'key Return')
    pic = picture(d:screenshot())
    assert.is_true(pic.any(TEXT_AREA, BLACK))                 -- the text shows
    assert.are.equal(GREEN, pic.at(BUTTON.x, BUTTON.y))

    sb:release()
    assert.is_true(util.eventually(function() return #p.leftovers(sb) == 0 end, 10000),
      table.concat(p.leftovers(sb), ', '))
    assert.raises_code('SANDBOX_ERROR', d.screenshot, d)
    assert.are.equal('gone', select(2, pcall(d.click, d, { x = 1, y = 1 })).reason)
  end)

  it('passes each action on: right and double clicks, scrolling, a drag, moves and keys', function()
    local sb = create({ lifetime_ms = 120000, desktop = true })
    local d = sb.desktop
    start_app(sb, app)
    d:click({ x = 200, y = 100, button = 'right' })
    wait_for(sb, 'press 3 200 100')
    d:double_click({ x = BUTTON.x, y = BUTTON.y })
    wait_for(sb, 'clicked 2')
    d:scroll({ direction = 'down', amount = 3, x = 150, y = 120 })
    d:scroll({ direction = 'up' })                            -- where the pointer is
    local log = wait_for(sb, 'release 4 150 120')
    assert.are.equal(3, count_lines(log, 'press 5 150 120'))
    d:drag({ from = { x = 30, y = 30 }, to = { x = 250, y = 140 } })
    wait_for(sb, 'release 1 250 140')
    d:move({ x = 100, y = 100 })
    d:click({})                                               -- where the pointer is
    wait_for(sb, 'press 1 100 100')
    d:key('shift+a')
    d:key('BackSpace')
    d:key('F5')
    log = wait_for(sb, 'key F5')
    assert.is_truthy(log:find('text A\n', 1, true))
    assert.is_truthy(log:find('key BackSpace\n', 1, true))
    sb:release()
  end)

  it('gives each sandbox a desktop of its own', function()
    local a = create({ lifetime_ms = 120000, desktop = true })
    local b = create({ lifetime_ms = 120000, desktop = true })
    start_app(a, app)
    -- b's display has the same number, and shows nothing of a's program; its clicks never reach it
    assert.are.equal(BLACK, picture(b.desktop:screenshot()).at(BUTTON.x, BUTTON.y))
    b.desktop:click({ x = BUTTON.x, y = BUTTON.y })
    local r = b:exec({ 'sh', '-c', 'xwd -root -silent >/dev/null && echo "$DISPLAY"' })
    assert.are.same({ 0, ':0\n' }, { r.exit_code, r.stdout })
    a.desktop:click({ x = 10, y = 10 })
    local log = wait_for(a, 'release 1 10 10')
    assert.are.equal(0, count_lines(log, 'clicked'))
    a:release()
    b:release()
  end)

  it('refuses what it cannot do, before it reaches the sandbox', function()
    local plain = create({ lifetime_ms = 60000 })
    assert.is_nil(plain.desktop)                              -- a desktop is asked for
    plain:release()
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, desktop = 'yes' })
    local sb = create({ lifetime_ms = 60000, desktop = true })
    local d = sb.desktop
    for _, bad in ipairs({
      { d.click, { x = -1, y = 5 } }, { d.click, { x = 1.5, y = 5 } }, { d.click, { x = 5 } },
      { d.click, { x = 5, y = 5, button = 'fourth' } }, { d.click, { x = 5, y = 5, z = 1 } }, { d.click, 'here' },
      { d.move, {} }, { d.move, { x = 70000, y = 1 } }, { d.scroll, { direction = 'sideways' } },
      { d.scroll, { direction = 'up', amount = 0 } }, { d.scroll, { direction = 'up', amount = 101 } },
      { d.drag, { from = { x = 1, y = 1 } } }, { d.type, 'a\0b' }, { d.type, 42 },
      { d.type, ('x'):rep(65537) }, { d.key, '' }, { d.key, 'ctrl+' }, { d.key, 'a b' }, { d.key, '-x' },
      { d.key, '$(reboot)' }, { d.key, ('a'):rep(65) },
    }) do
      assert.raises_code('INVALID_INPUT', bad[1], d, bad[2])
    end
    local err = assert.raises_code('INVALID_INPUT', d.view_url, d)
    assert.matches('no live view', err.message)
    d:type('')
    sb:release()
  end)

  it("passes the conformance suite's desktop case", function()
    local sb = create({ lifetime_ms = 60000 })
    local found
    for _, case in ipairs(require('mayura.sandbox.testing').sandbox_conformance) do
      if case.name:find('desktop', 1, true) then found = case end
    end
    assert.are.equal('passed', found.run({ sandbox = sb }))
  end)

  if p.kind == 'docker' then
    it('fails a create on an image without the programs with INVALID_INPUT, and leaves nothing', function()
      local mark = ('%08x'):format(math.random(0, 0x7fffffff))
      local err = assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, desktop = true,
        image = providers.BUSYBOX, labels = { desktop_spec = mark } })
      assert.matches('lacks Xvfb, xkbcomp, xdotool, xwd, xwdtopnm, pnmtopng', err.message)
      assert.are.equal(0, pool:count())
      assert.is_nil(providers.host('docker ps -aq --filter label=desktop_spec=' .. mark):match('%x'))
      -- without the option, the provider offers no desktop
      local bare = p.make_pool({ max_sandboxes = 1 })
      assert.is_false(bare.provider.features.desktop)
      assert.raises_code('INVALID_INPUT', bare.create, bare, { lifetime_ms = 60000, desktop = true })
      assert.are.equal(0, bare:count())
    end)
  end

  describe('the desktop tools', function()
    local GRANTS = {
      'model:scripted', 'tool:screen.screenshot', 'tool:screen.click', 'tool:screen.type', 'tool:screen.key',
      'tool:screen.scroll', 'sandbox:screen:desktop', 'effect:read', 'effect:write',
    }
    local function call(id, tool, input)
      return { type = 'tool_calls', usage = { cost_micros = 0 },
        calls = { { id = id, tool_id = 'screen.' .. tool, input = input } } }
    end
    local function run(sb, steps, grants)
      local tools = sandbox.sandbox_tools(sb, { name = 'screen', desktop = true })
      local agent = mayura.define_agent({
        id = 'clicker', version = '1', instructions = 'Use the desktop.', tools = tools,
        model = testing.scripted_model(steps),
        input = z.object({ task = z.string() }), output = z.object({ summary = z.string() }),
      })
      local runtime = mayura.create_runtime({ profile = 'ephemeral', permissions = { allow = grants } })
      local outcome = runtime:submit(agent, { input = { task = 'Press the button.' } }):result()
      runtime:close()
      return outcome
    end

    it('drive the program in a scripted run with their grants', function()
      local sb = create({ lifetime_ms = 120000, desktop = true })
      start_app(sb, app)
      local seen = {}
      local outcome = run(sb, {
        call('c1', 'screenshot', {}),
        function(request)
          local result = request.messages[#request.messages].result
          assert.are.same({ 'image/png', 'base64' }, { result.media_type, result.encoding })
          local png = core.base64.decode(result.base64)
          assert.are.same({ W, H }, { png_size(png) })
          seen.before = picture(png).at(BUTTON.x, BUTTON.y)
          return call('c2', 'click', { x = BUTTON.x, y = BUTTON.y })
        end,
        call('c3', 'type', { text = 'from the model' }),
        call('c4', 'key', { name = 'Enter' }),
        call('c5', 'scroll', { direction = 'down', amount = 2, x = 100, y = 100 }),
        call('c6', 'screenshot', {}),
        function(request)
          local png = core.base64.decode(request.messages[#request.messages].result.base64)
          seen.after = picture(png).at(BUTTON.x, BUTTON.y)
          return { type = 'final', output = { summary = 'pressed' }, usage = { cost_micros = 0 } }
        end,
      }, GRANTS)
      assert.are.equal('succeeded', outcome.status, outcome.error and tostring(outcome.error))
      assert.are.same({ BLUE, GREEN }, { seen.before, seen.after })
      local log = wait_for(sb, 'text from the model')
      assert.is_truthy(log:find('clicked 1\n', 1, true))
      assert.is_truthy(log:find('key Return\n', 1, true))
      assert.are.equal(2, count_lines(log, 'press 5 100 100'))
      sb:release()
    end)

    it('are blocked without sandbox:<name>:desktop, and the program sees nothing', function()
      local sb = create({ lifetime_ms = 120000, desktop = true })
      start_app(sb, app)
      local grants = {}
      for _, g in ipairs(GRANTS) do if g ~= 'sandbox:screen:desktop' then grants[#grants + 1] = g end end
      local outcome = run(sb, { call('c1', 'click', { x = BUTTON.x, y = BUTTON.y }) }, grants)
      assert.are.equal('blocked', outcome.status)
      assert.are.equal('PERMISSION_DENIED', outcome.error.code)
      assert.are.equal('ready 320 160\n', app_log(sb))
      assert.are.equal(BLUE, picture(sb.desktop:screenshot()).at(BUTTON.x, BUTTON.y))
      sb:release()
    end)

    it('hand a sandbox without a desktop back to the model as INVALID_INPUT', function()
      local sb = create({ lifetime_ms = 60000 })
      local tools = sandbox.sandbox_tools(sb, { name = 'screen', desktop = true })
      local ok, err = pcall(tools[3].run, {}, {})
      assert.are.equal('screen.screenshot', tools[3].id)
      assert.is_false(ok)
      assert.are.same({ 'INVALID_INPUT', true }, { err.code, err.tool_error })
      sb:release()
    end)
  end)
end

describe('a desktop', function()
  for _, p in ipairs(providers.list()) do
    describe('on ' .. p.name, function() desktop_specs(p) end)
  end
end)

-- The pool in front of any provider's desktop, with the one-file provider of spec/support and a
-- desktop that answers what the spec tells it to (a provider's answers are not trusted).
describe("the pool's checks of a provider's desktop", function()
  local dir = require('support.dir_provider')
  local FEATURES = { stdin = true, ports = false, desktop = true, network = { 'none' } }
  local function provider_with(desktop_of)
    local p = dir.dir_sandboxes({ features = FEATURES })
    local create = p.create
    p.create = function(self, spec)
      local b = create(self, spec)
      b.desktop = desktop_of(spec, b)
      return b
    end
    return p
  end
  local function pool_of(p) return sandbox.create_sandboxes(p, { max_sandboxes = 2, max_lifetime_ms = 60000 }) end

  it('refuses a sandbox without the desktop it was asked for, and releases it', function()
    local released = false
    local p = provider_with(function(_, b)
      local release = b.release
      b.release = function(...) released = true return release(...) end
      return nil
    end)
    local pool = pool_of(p)
    local err = assert.raises_code('SANDBOX_ERROR', pool.create, pool, { lifetime_ms = 60000, desktop = true })
    assert.are.equal('failed', err.reason)
    assert.is_true(released)
    assert.are.equal(0, pool:count())
    assert.is_true(p.specs[1].desktop)
    -- not asked for: no desktop, and none is needed
    assert.is_nil(pool:create({ lifetime_ms = 60000 }).desktop)
    pool:close()
  end)

  it('passes checked arguments on, and refuses answers that are not a PNG or a size', function()
    local calls = {}
    local answers = { screenshot = 'not a png', size = { width = 0, height = 'x' } }
    local p = provider_with(function()
      local d = {}
      for _, name in ipairs({ 'click', 'move', 'scroll', 'type', 'key', 'screenshot', 'size' }) do
        d[name] = function(_, arg)
          calls[#calls + 1] = { name, arg }
          return answers[name]
        end
      end
      return d
    end)
    local pool = pool_of(p)
    local sb = pool:create({ lifetime_ms = 60000, desktop = true })
    local d = sb.desktop
    d:click({})
    d:click({ x = 3, y = 4, button = 'right' })
    d:scroll({ direction = 'left' })
    d:key('ctrl+Tab')
    assert.are.same({
      { 'click', { button = 'left' } }, { 'click', { x = 3, y = 4, button = 'right' } },
      { 'scroll', { direction = 'left', amount = 1 } }, { 'key', 'ctrl+Tab' },
    }, calls)
    assert.are.equal('failed', assert.raises_code('SANDBOX_ERROR', d.screenshot, d).reason)
    assert.are.equal('failed', assert.raises_code('SANDBOX_ERROR', d.size, d).reason)
    answers.screenshot = '\137PNG\r\n\26\n\0\0\0\13IHDR\0\0\0\1\0\0\0\1'
    answers.size = { width = 2, height = 3 }
    assert.are.equal(answers.screenshot, d:screenshot())
    assert.are.same({ width = 2, height = 3 }, d:size())
    -- what the provider leaves out is said, not attempted
    local n = #calls
    assert.matches('double click', assert.raises_code('INVALID_INPUT', d.double_click, d, {}).message)
    assert.raises_code('INVALID_INPUT', d.drag, d, { from = { x = 1, y = 1 }, to = { x = 2, y = 2 } })
    assert.raises_code('INVALID_INPUT', d.view_url, d)
    assert.are.equal(n, #calls)
    -- a provider's own failure text stays out of the error
    answers = nil
    local err = assert.raises_code('SANDBOX_ERROR', d.move, d, { x = 1, y = 1 })
    assert.are.equal('failed', err.reason)
    assert.is_nil(err.message:find('answers', 1, true))
    sb:release()
    assert.are.equal('gone', assert.raises_code('SANDBOX_ERROR', d.key, d, 'a').reason)
    pool:close()
  end)
end)
