--- mayura.mcp.cli: `mayura serve`, the MCP server program.
--
--   mayura serve --policy FILE.lua                       stdio (the form an MCP client's configuration names)
--   mayura serve --policy FILE.lua --http [HOST:]PORT    Streamable HTTP at http://HOST:PORT/mcp
--
-- Options: `--token-file FILE` (HTTP: the bearer token, first line; else the
-- MAYURA_MCP_TOKEN environment variable; never on the command line, where
-- other users of the host could read it), `--allow-remote` (HTTP: listen on
-- a host that is not loopback), `--origin URL` (HTTP: another allowed
-- Origin; repeatable), `--log FILE` (the structured log, one JSON record per
-- line, appended; stderr by default), `--max-message-bytes N` (1 MiB),
-- `--session-idle-ms N` (HTTP: a session with no request for N ms ends; 30
-- minutes), `--progress-ms N` (the interval of progress notifications; 1000).
--
-- The policy files are loaded and checked completely before anything listens;
-- their `serve { agent, max_sessions }` names the agent whose tools, grants,
-- limits and budget every MCP session gets, and each MCP session is that
-- agent's runtime session (`env:session(id)` of mayura.policy): a sandbox of
-- its own on first use, released when the session ends. Logs never go to
-- stdout, which belongs to the protocol under stdio. SIGINT and SIGTERM end
-- every session (releasing its sandbox) before the program exits.
local uv = require('luv')
local core = require('mayura.core')
local task = require('mayura._task')
local mcp = require('mayura.mcp')

local M = {}

local USAGE = [[usage: mayura serve --policy FILE.lua [--policy FILE.lua ...] [--http [HOST:]PORT]
         [--token-file FILE] [--allow-remote] [--origin URL]... [--log FILE] [--max-message-bytes N]
         [--session-idle-ms N] [--progress-ms N]
]]

local function die(msg, status)
  io.stderr:write('mayura serve: ' .. msg .. '\n')
  os.exit(status or 2)
end

--- Parses the arguments of `mayura serve`; returns the options or raises a message.
function M.parse_args(args)
  local o = { policies = {}, origins = {} }
  local i = 1
  local function value(name)
    i = i + 1
    if args[i] == nil then error(name .. ' needs a value', 0) end
    return args[i]
  end
  while i <= #args do
    local a = args[i]
    if a == '--policy' then o.policies[#o.policies + 1] = value(a)
    elseif a == '--http' then
      local v = value(a)
      local host, port = v:match('^%[?([^%]]*)%]?:(%d+)$')
      if not host then host, port = '127.0.0.1', v:match('^(%d+)$') end
      if not port then error('--http expects [HOST:]PORT', 0) end
      o.host, o.port = host, tonumber(port)
    elseif a == '--token-file' then o.token_file = value(a)
    elseif a == '--allow-remote' then o.allow_remote = true
    elseif a == '--origin' then o.origins[#o.origins + 1] = value(a)
    elseif a == '--log' then o.log = value(a)
    elseif a == '--max-message-bytes' then
      o.max_message_bytes = tonumber(value(a))
      if not o.max_message_bytes or o.max_message_bytes < 1024 then error('--max-message-bytes must be >= 1024', 0) end
    elseif a == '--session-idle-ms' or a == '--progress-ms' then
      local n = tonumber(value(a))
      if not n or n < 1 or n ~= math.floor(n) then error(a .. ' must be a whole number of ms', 0) end
      if a == '--progress-ms' then o.progress_ms = n else o.session_idle_ms = n end
    elseif a == '-h' or a == '--help' then o.help = true
    else error('unknown argument ' .. a, 0) end
    i = i + 1
  end
  return o
end

local function read_token(o)
  if o.token_file then
    local f, err = io.open(o.token_file, 'r')
    if not f then die('cannot read the token file: ' .. tostring(err)) end
    local t = f:read('l')
    f:close()
    return t and t:match('^%s*(.-)%s*$') or ''
  end
  return os.getenv('MAYURA_MCP_TOKEN')
end

local function log_writer(path)
  local f = io.stderr
  if path then
    local err
    f, err = io.open(path, 'a')
    if not f then die('cannot open the log: ' .. tostring(err)) end
  end
  return function(record)
    f:write(core.json.encode(record), '\n')
    f:flush()
  end
end

--- Runs the server until stdin ends (stdio) or a signal comes (HTTP). Called as a task by the host.
function M.main(...)
  local ok, o = pcall(M.parse_args, { ... })
  if not ok then die(tostring(o) .. '\n' .. USAGE) end
  if o.help then io.stdout:write(USAGE) return end
  if #o.policies == 0 then die('--policy FILE.lua is required\n' .. USAGE) end
  local token
  if o.port then
    token = read_token(o)
    if not token or #token < 16 then
      die('the HTTP transport needs a bearer token of at least 16 characters (--token-file or MAYURA_MCP_TOKEN)')
    end
  end
  local log = log_writer(o.log)
  local lok, env = pcall(function() return require('mayura.policy').load_policy(o.policies):open() end)
  if not lok then die(tostring(type(env) == 'table' and (env.code .. ': ' .. tostring(env.message)) or env), 1) end
  local server = mcp.server({
    open_session = function(id) return env:session(id) end,
    progress_interval_ms = o.progress_ms,
    log = log,
    secrets = token and { token } or nil,
  })
  local stopping = false
  local listener
  local function stop(reason)
    if stopping then return end
    stopping = true
    task.spawn(function()
      if listener then listener:close() end
      server:close(reason)
      env:close()
      log({ event = 'stopped', reason = reason })
      os.exit(0)
    end)
  end
  local signals = {}
  for _, name in ipairs({ 'sigint', 'sigterm' }) do
    local s = uv.new_signal()
    s:start(name, function() stop(name) end)
    s:unref()
    signals[#signals + 1] = s
  end
  if o.port then
    local hok, res = pcall(require('mayura.mcp.http').listen, server, { host = o.host, port = o.port, token = token,
      allow_remote = o.allow_remote, origins = o.origins, max_message_bytes = o.max_message_bytes,
      session_idle_ms = o.session_idle_ms })
    if not hok then die(type(res) == 'table' and (res.code .. ': ' .. tostring(res.message)) or tostring(res), 1) end
    listener = res
    log({ event = 'listening', url = listener:url() })
    io.stderr:write('mayura serve: listening on ' .. listener:url() .. '\n')
    task.await(function() end)   -- until a signal
  else
    log({ event = 'serving', transport = 'stdio' })
    require('mayura.mcp.stdio').serve(server, { max_message_bytes = o.max_message_bytes })
    env:close()
    log({ event = 'stopped', reason = 'stdin ended' })
    for _, s in ipairs(signals) do s:close() end
  end
end

return M
