--- A stand-in for CodeSandbox's SDK API and its pitcher (the in-VM agent the SDK talks
-- MessagePack to over a WebSocket), as @codesandbox/sdk 2.4.2 uses them, on a stand-in
-- (support/stand_in.lua) backed by real local sandboxes: each running VM is a local sandbox.
--
--   local state = codesandbox_service.install(svc, backing, { token = T })
--   local api = svc:url('')                 -- the SDK's baseUrl / the provider's base_url
--   state:start_front(dir)                  -- the pitcher's WebSocket front (a Node process)
--
-- REST (`Authorization: Bearer T`, else 401 { success = false, errors }); every answer is the
-- envelope { success, errors, data }:
--   POST   /sandbox/{template}/fork   { privacy, title, tags, path, private_preview } -> { id, alias,
--                                     title }; the template is `pcz35m` or a sandbox made here
--   POST   /vm/{id}/start             { hibernation_timeout_seconds (1..86400), tier, ... } -> the
--                                     VM (booted as a local sandbox if it was not running):
--                                     { bootup_type, cluster, id, pitcher_url, pitcher_token,
--                                     workspace_path, user_workspace_path, pitcher_version, ... }
--   POST   /vm/{id}/hibernate, /vm/{id}/shutdown   the VM stops (its connections close and its
--                                     processes end); its files are kept, as CodeSandbox keeps
--                                     them, and are there again at the next start (bootup_type
--                                     RESUME after a hibernate, CLEAN after a shutdown); a fork
--                                     of a sandbox made here starts with its files
--   DELETE /vm/{id}                   the sandbox is gone for good
--   GET    /sandbox/{id}              { id, title, tags, privacy }
-- An unknown or deleted sandbox is 404.
--
-- The pitcher: spec/npm/codesandbox_front.mjs (Node, on the `ws` package) serves the WebSocket
-- `/?token=<pitcher_token>` and carries each binary frame, unchanged, to this stand-in
-- (`POST /_pitcher/in`), and the frames this stand-in sends back (`GET /_pitcher/out`, a stream
-- of 4-byte big-endian lengths and frames) to the client. Frames are MessagePack, read and
-- written here with core.msgpack: requests { id, method, params }, answers { id, method, status
-- = 0, result } or { id, status = 1, error = { code, message, data } }, notifications { method,
-- params }. Methods: client/join, setup/get (one finished step), system/update, port/list (none),
-- shell/create
-- (the command runs by `sh -c` in `cwd`; its output comes as one `shell/out` notification, stdout
-- then stderr, as a terminal merges them, then `shell/exit`; for the SDK's connections, appId
-- `sdk`, only once the SDK renamed the shell, which it does as it starts listening), shell/terminate, shell/rename,
-- fs/writeFile, fs/readFile, fs/readdir, fs/mkdir, fs/remove, fs/stat (file errors are code 102
-- with data.errno). Faults: `state.stall_shells` (the next that many commands never end),
-- `state:vanish(id)` (deleted behind the client's back: its connections close).
-- Where it differs: the workspace is the local sandbox's /workspace; commands run without a
-- terminal, their output made a terminal's only by a carriage return before each newline (no
-- colours, no line discipline otherwise); no network (the local sandbox's 'none'); no sessions, hosts or
-- previews.
local core = require('mayura.core')
local task = require('mayura._task')

local mp, json = core.msgpack, core.json

local M = {}

M.TEMPLATE = 'pcz35m'
M.WORKSPACE = '/workspace'

local seq = 0
local function new_id(n)
  seq = seq + 1
  -- the counter first: two ids made in the same millisecond differ within the first `n` digits
  local s = string.format('%x%05x%x', seq, core.now_ms() % 0xfffff, math.random(0, 0xfffff))
  return s:sub(1, n or #s)
end

local function envelope(status, data, err)
  if err then return { status = status, json = { success = false, errors = { err } } } end
  return { status = status or 200, json = { success = true, errors = setmetatable({}, json.array_mt), data = data } }
end

local function be32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
end

--- Installs the API on `svc` over `backing`. Returns the state: `sandboxes` (id -> record with
-- `backing_id` while running), `messages` (every pitcher request, decoded), `stall_shells`.
function M.install(svc, backing, opts)
  local state = { sandboxes = {}, tokens = {}, conns = {}, messages = {}, stall_shells = 0, shells = {} }
  local token = opts.token

  local function refuse(req)
    if req.headers.authorization ~= 'Bearer ' .. token then
      return envelope(401, nil, 'Unauthorized: the token was not accepted')
    end
    return nil
  end

  local function close_conns(sid)
    for _, c in pairs(state.conns) do
      if c.sid == sid then
        c.closed = true
        if c.wake then c.wake() end
      end
    end
  end

  -- The sandbox's files as a gzipped tar of the workspace (its disk, which CodeSandbox keeps
  -- across hibernate and shutdown), or nil when it has no VM.
  local function save_disk(s)
    local sb = s.backing_id and backing:get(s.backing_id)
    if not sb then return nil end
    local ok, r = pcall(sb.exec, sb, { 'tar', '-czf', '-', '-C', M.WORKSPACE, '.' }, { timeout_ms = 120000 })
    if ok and r.exit_code == 0 then return r.stdout end
    svc.failures[#svc.failures + 1] = 'codesandbox stand-in: the disk could not be saved'
    return nil
  end

  local function stop_vm(s, keep_disk)
    if keep_disk then s.disk = save_disk(s) or s.disk end
    if s.backing_id then backing:release(s.backing_id) end
    s.backing_id = nil
    for t, id in pairs(state.tokens) do
      if id == s.id then state.tokens[t] = nil end
    end
    close_conns(s.id)
  end

  svc:route('POST', '/sandbox/{template}/fork', function(req)
    local no = refuse(req)
    if no then return no end
    if req.params.template ~= M.TEMPLATE and not state.sandboxes[req.params.template] then
      return envelope(404, nil, 'Sandbox not found')
    end
    local body = type(req.json) == 'table' and req.json or {}
    local s = { id = new_id(6), title = body.title, tags = body.tags, privacy = body.privacy, body = body }
    local parent = state.sandboxes[req.params.template]
    if parent then s.disk = save_disk(parent) or parent.disk end   -- a fork starts from its parent's files
    state.sandboxes[s.id] = s
    return envelope(201, { id = s.id, alias = s.id, title = s.title or json.null })
  end)

  svc:route('POST', '/vm/{id}/start', function(req)
    local no = refuse(req)
    if no then return no end
    local s = state.sandboxes[req.params.id]
    if not s then return envelope(404, nil, 'Sandbox not found') end
    local body = type(req.json) == 'table' and req.json or {}
    local idle = body.hibernation_timeout_seconds
    if idle ~= nil and (type(idle) ~= 'number' or idle % 1 ~= 0 or idle < 1 or idle > 86400) then
      return envelope(422, nil, 'hibernation_timeout_seconds must be 1..86400')
    end
    s.start = body
    local bootup = 'RUNNING'
    if not s.backing_id or not backing:get(s.backing_id) then
      local sb
      s.backing_id, sb = backing:create({ lifetime_ms = 3600000 })
      bootup = s.hibernated and 'RESUME' or 'CLEAN'
      if s.disk then
        local r = sb:exec({ 'tar', '-xzf', '-', '-C', M.WORKSPACE }, { stdin = s.disk, timeout_ms = 120000 })
        if r.exit_code ~= 0 then svc.failures[#svc.failures + 1] = 'codesandbox stand-in: the disk was not restored' end
      end
    end
    s.hibernated = nil
    local pt = 'pt_' .. new_id() .. new_id()
    state.tokens[pt] = s.id
    return envelope(200, {
      bootup_type = bootup, cluster = 'stand-in', id = s.id, pitcher_url = state.pitcher_url or 'ws://127.0.0.1:1',
      pitcher_token = pt, workspace_path = M.WORKSPACE, user_workspace_path = M.WORKSPACE,
      pitcher_version = '0.367.10', latest_pitcher_version = '0.367.10', pitcher_manager_version = '0.0.1',
      reconnect_token = 'rt_' .. new_id(), use_pint = false,
    })
  end)

  for _, action in ipairs({ 'hibernate', 'shutdown' }) do
    svc:route('POST', '/vm/{id}/' .. action, function(req)
      local no = refuse(req)
      if no then return no end
      local s = state.sandboxes[req.params.id]
      if not s then return envelope(404, nil, 'Sandbox not found') end
      stop_vm(s, true)
      s.hibernated = action == 'hibernate'
      return envelope(200, { id = s.id })
    end)
  end

  svc:route('DELETE', '/vm/{id}', function(req)
    local no = refuse(req)
    if no then return no end
    local s = state.sandboxes[req.params.id]
    if not s then return envelope(404, nil, 'Sandbox not found') end
    stop_vm(s)
    state.sandboxes[s.id] = nil
    s.deleted = true
    return envelope(200, { id = s.id })
  end)

  svc:route('GET', '/sandbox/{id}', function(req)
    local no = refuse(req)
    if no then return no end
    local s = state.sandboxes[req.params.id]
    if not s then return envelope(404, nil, 'Sandbox not found') end
    return envelope(200, { id = s.id, title = s.title or json.null, tags = s.tags or setmetatable({}, json.array_mt),
      privacy = s.privacy or 2 })
  end)

  --- Deletes a sandbox behind its client's back.
  function state.vanish(_, id)
    local s = state.sandboxes[id]
    if not s then return end
    stop_vm(s)
    state.sandboxes[id] = nil
  end

  -- {======================================================
  -- The pitcher
  -- =======================================================

  local function push(c, msg)
    c.queue[#c.queue + 1] = mp.encode(msg)
    if c.wake then c.wake() end
  end


  local function run_shell(c, sb, shell, p)
    local stall = state.stall_shells > 0
    if stall then state.stall_shells = state.stall_shells - 1 end
    if stall then
      while not shell.signal.cancelled and not c.closed do task.sleep(50) end
      return
    end
    local ok, r = pcall(sb.exec, sb, { 'sh', '-c', p.command }, { cwd = type(p.cwd) == 'string' and p.cwd or nil,
      timeout_ms = 600000, signal = shell.signal })
    if shell.signal.cancelled or c.closed then return end
    if not ok then r = { exit_code = 127, stdout = '', stderr = 'the stand-in could not run the command\n' } end
    -- The SDK listens to a shell only once its answer came back, right after it asks to rename the
    -- shell: its notifications wait for that rename (a second at most), else they could arrive
    -- in the same read as the answer and go unheard.
    local deadline = core.hrtime_ms() + 1000
    while c.sdk and not shell.renamed and not c.closed and core.hrtime_ms() < deadline do task.sleep(2) end
    -- as a terminal gives it: a carriage return before every newline
    local out = (r.stdout .. r.stderr):gsub('\n', '\r\n')
    if out ~= '' then push(c, { method = 'shell/out', params = { shellId = shell.id, out = out } }) end
    push(c, { method = 'shell/exit', params = { shellId = shell.id, shellType = 'TERMINAL',
      exitCode = r.exit_code or 137 } })
  end

  local handlers = {}

  handlers['client/join'] = function(c, _, p)
    c.sdk = type(p.clientInfo) == 'table' and p.clientInfo.appId == 'sdk'
    return { client = { clientId = new_id(), username = 'stand-in' }, reconnectToken = 'rt_' .. new_id() }
  end
  handlers['setup/get'] = function()
    return { state = 'FINISHED', currentStepIndex = 0, steps = { { name = 'Boot', command = 'true',
      finishStatus = 'SUCCEEDED', shellId = json.null } } }
  end
  handlers['system/update'] = function() return {} end
  handlers['shell/rename'] = function(_, _, p)
    local shell = state.shells[p.shellId or '']
    if shell then shell.renamed = true end
    return {}
  end
  handlers['port/list'] = function() return { list = setmetatable({}, json.array_mt) } end

  handlers['shell/create'] = function(c, sb, p)
    if type(p.command) ~= 'string' then return nil, { code = 200, message = 'a command is required' } end
    local shell = { id = new_id(8), signal = task.cancel_token(), sid = c.sid }
    state.shells[shell.id] = shell
    task.spawn(function()
      task.sleep(1)   -- the answer goes first
      run_shell(c, sb, shell, p)
    end)
    return { shellId = shell.id, name = p.command, status = 'RUNNING', exitCode = json.null,
      buffer = setmetatable({}, json.array_mt), shellType = 'TERMINAL', startCommand = p.command,
      ownerUsername = 'stand-in', isSystemShell = p.isSystemShell == true }
  end

  handlers['shell/terminate'] = function(c, _, p)
    local shell = state.shells[p.shellId or '']
    if not shell or shell.sid ~= c.sid then return nil, { code = 201, message = 'Shell does not exist' } end
    shell.signal:cancel()
    push(c, { method = 'shell/terminate', params = { shellId = shell.id } })
    return { shellId = shell.id }
  end

  local function path_of(p)
    if type(p) ~= 'string' or p == '' then return nil end
    if p:sub(1, 1) ~= '/' then p = M.WORKSPACE .. '/' .. p end
    return p
  end

  local function shell_out(sb, argv)
    local ok, r = pcall(sb.exec, sb, argv, { timeout_ms = 60000 })
    return ok and r or { exit_code = 1, stdout = '', stderr = '' }
  end

  handlers['fs/writeFile'] = function(_, sb, p)
    local path = path_of(p.path)
    if not path or type(p.content) ~= 'string' then return nil, { code = 101, message = 'invalid path' } end
    local ok = pcall(sb.write_file, sb, path, p.content)
    if not ok then return nil, { code = 102, message = 'cannot write', data = { errno = -13 } } end
    return {}
  end

  handlers['fs/readFile'] = function(_, sb, p)
    local path = path_of(p.path)
    if not path then return nil, { code = 101, message = 'invalid path' } end
    local ok, data = pcall(sb.read_file, sb, path)
    if not ok or not data then return nil, { code = 102, message = 'ENOENT: no such file', data = { errno = -2 } } end
    return { content = mp.bin(data) }
  end

  handlers['fs/readdir'] = function(_, sb, p)
    local path = path_of(p.path)
    if not path then return nil, { code = 101, message = 'invalid path' } end
    local ok, entries = pcall(sb.list_files, sb, path)
    if not ok then return nil, { code = 102, message = 'ENOENT: no such directory', data = { errno = -2 } } end
    local out = setmetatable({}, json.array_mt)
    for _, e in ipairs(entries) do
      out[#out + 1] = { name = e.name, type = e.type == 'directory' and 1 or 0, isSymlink = e.type == 'symlink' }
    end
    return { entries = out }
  end

  handlers['fs/mkdir'] = function(_, sb, p)
    local path = path_of(p.path)
    if not path then return nil, { code = 101, message = 'invalid path' } end
    local r = shell_out(sb, p.recursive and { 'mkdir', '-p', '--', path } or { 'mkdir', '--', path })
    if r.exit_code ~= 0 then return nil, { code = 102, message = 'cannot make it', data = { errno = -17 } } end
    return {}
  end

  handlers['fs/remove'] = function(_, sb, p)
    local path = path_of(p.path)
    if not path then return nil, { code = 101, message = 'invalid path' } end
    local r = shell_out(sb, p.recursive and { 'rm', '-rf', '--', path } or { 'rm', '-f', '--', path })
    if r.exit_code ~= 0 then return nil, { code = 102, message = 'cannot remove it', data = { errno = -21 } } end
    return {}
  end

  handlers['fs/stat'] = function(_, sb, p)
    local path = path_of(p.path)
    if not path then return nil, { code = 101, message = 'invalid path' } end
    local r = shell_out(sb, { 'stat', '-c', '%F|%s|%Y', '--', path })
    local kind, size, mtime = r.stdout:match('^([^|]*)|(%d+)|(%d+)')
    if r.exit_code ~= 0 or not kind then return nil, { code = 102, message = 'ENOENT', data = { errno = -2 } } end
    local t = tonumber(mtime) * 1000
    return { type = kind:find('directory') and 1 or 0, isSymlink = kind:find('link') ~= nil, size = tonumber(size),
      mtime = t, ctime = t, atime = t }
  end

  -- The front asks whether a pitcher token opens a connection.
  svc:route('GET', '/_pitcher/check', function(req)
    local sid = state.tokens[req.query.token or '']
    if not sid then return { status = 401, body = '' } end
    local s = state.sandboxes[sid]
    if not s or not s.backing_id then return { status = 404, body = '' } end
    return { status = 200, body = '' }
  end)

  -- The frames for one connection of the front, as they come.
  svc:route('GET', '/_pitcher/out', function(req)
    local sid = state.tokens[req.query.token or '']
    local cid = req.query.conn or ''
    if not sid or cid == '' or state.conns[cid] then return { status = 404, body = '' } end
    local c = { id = cid, sid = sid, queue = {}, closed = false }
    state.conns[cid] = c
    req.signal:on_cancel(function()
      c.closed = true
      if c.wake then c.wake() end
    end)
    return {
      headers = { ['Content-Type'] = 'application/octet-stream' },
      stream = function(send)
        while true do
          while #c.queue > 0 do
            local f = table.remove(c.queue, 1)
            if not send(be32(#f) .. f) then c.closed = true end
          end
          if c.closed then break end
          task.await(function(done) c.wake = done end)
          c.wake = nil
        end
        state.conns[cid] = nil
      end,
    }
  end)

  svc:route('POST', '/_pitcher/close', function(req)
    local c = state.conns[req.query.conn or '']
    if c then
      c.closed = true
      if c.wake then c.wake() end
    end
    return { status = 204, body = '' }
  end)

  -- One frame from the client.
  svc:route('POST', '/_pitcher/in', function(req)
    local c = state.conns[req.query.conn or '']
    if not c or c.closed then return { status = 404, body = '' } end
    local msg = mp.decode(req.body)
    if type(msg) ~= 'table' or type(msg.method) ~= 'string' then return { status = 400, body = '' } end
    state.messages[#state.messages + 1] = msg
    local s = state.sandboxes[c.sid]
    local sb = s and s.backing_id and backing:get(s.backing_id)
    if not sb then
      c.closed = true
      if c.wake then c.wake() end
      return { status = 204, body = '' }
    end
    local h = handlers[msg.method]
    local result, err
    if not h then
      err = { code = 1, message = 'unknown method' }
    else
      local p = type(msg.params) == 'table' and msg.params or {}
      local ok, r, e = pcall(h, c, sb, p)
      if not ok then
        svc.failures[#svc.failures + 1] = tostring(r)
        err = { code = 1, message = 'the stand-in failed' }
      end
      result, err = r, err or e
    end
    if msg.id ~= nil then
      if err then
        push(c, { id = msg.id, method = msg.method, status = 1, error = err })
      else
        push(c, { id = msg.id, method = msg.method, status = 0, result = result })
      end
    end
    return { status = 204, body = '' }
  end)

  -- }======================================================

  --- Starts the pitcher's WebSocket front (spec/npm/codesandbox_front.mjs); returns its ws:// URL.
  function state.start_front(_, dir)
    local process = require('mayura.process')
    local portfile = dir .. '/codesandbox-front.port'
    os.remove(portfile)
    state.front = task.spawn(function()
      return process.run({ 'node', 'spec/npm/codesandbox_front.mjs', svc:url(''), portfile }, { timeout_ms = 3600000 })
    end)
    local deadline = core.hrtime_ms() + 15000
    while core.hrtime_ms() < deadline do
      local f = io.open(portfile)
      local port = f and f:read('a')
      if f then f:close() end
      if port and port:match('^%d+$') then
        state.front_url = 'http://127.0.0.1:' .. port
        state.pitcher_url = 'ws://127.0.0.1:' .. port
        return state.pitcher_url
      end
      task.sleep(20)
    end
    error('the pitcher front did not start')
  end

  function state.close()
    for _, c in pairs(state.conns) do
      c.closed = true
      if c.wake then c.wake() end
    end
    for _, shell in pairs(state.shells) do shell.signal:cancel() end
    if state.front then
      pcall(require('mayura.http').request, { url = state.front_url .. '/quit', timeout_ms = 5000 })
      state.front:wait()
      state.front = nil
    end
  end

  return state
end

return M
