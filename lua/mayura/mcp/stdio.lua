--- mayura.mcp.stdio: the MCP stdio transport, one session over standard input and output.
--
--   require('mayura.mcp.stdio').serve(server, { max_message_bytes = 1048576 })   -- in a task
--
-- Messages are lines of JSON (UTF-8, no embedded newline) on stdin; answers
-- and notifications are written to stdout one per line, and nothing else is
-- (logs go to stderr). A line longer than `max_message_bytes` is dropped as
-- it streams in (never held whole) and answered with -32600; malformed
-- JSON gets -32700: the session goes on. When stdin ends the client has
-- gone: calls still running are cancelled (their commands stopped), the
-- session is closed (its sandbox released) and `serve` returns.
local uv = require('luv')
local core = require('mayura.core')
local task = require('mayura._task')
local mcp = require('mayura.mcp')

local json = core.json

local M = {}

local function open_handle(fd, readable)
  local kind = uv.guess_handle(fd)
  if kind == 'tty' then return uv.new_tty(fd, readable) end
  if kind == 'pipe' then
    local p = uv.new_pipe(false)
    p:open(fd)
    return p
  end
  return nil, kind
end

--- Feeds bytes to a line splitter with a cap; calls on_line(line) and on_oversize() as lines end.
function M.line_splitter(max, on_line, on_oversize)
  local parts, size, dropping = {}, 0, false
  return function(data)
    local pos = 1
    while pos <= #data do
      local nl = data:find('\n', pos, true)
      local piece = data:sub(pos, (nl or (#data + 1)) - 1)
      if not dropping then
        if size + #piece > max then
          dropping, parts, size = true, {}, 0
        else
          parts[#parts + 1] = piece
          size = size + #piece
        end
      end
      if not nl then break end
      if dropping then
        dropping = false
        on_oversize()
      else
        local line = table.concat(parts)
        parts, size = {}, 0
        if line:sub(-1) == '\r' then line = line:sub(1, -2) end
        if line:find('%S') then on_line(line) end
      end
      pos = nl + 1
    end
  end
end

--- Serves one session on stdin/stdout until stdin ends.
function M.serve(server, options)
  options = options or {}
  local max = options.max_message_bytes or 1048576
  local input = assert(open_handle(options.input_fd or 0, true))
  local out_handle = open_handle(options.output_fd or 1, false)
  local function write(msg)
    local line = json.encode(msg) .. '\n'
    if out_handle then
      if not out_handle:is_closing() then out_handle:write(line) end
    else
      -- a regular file takes a blocking write
      io.stdout:write(line)
      io.stdout:flush()
    end
  end
  local session = server:session('stdio')
  local out = {
    send = write,
    reply = function(msg) if msg ~= nil then write(msg) end end,
  }
  local feed = M.line_splitter(max, function(line)
    session:handle(line, out)
  end, function()
    server:log({ event = 'bad_message', session = session.id, message = 'a message over ' .. max .. ' bytes' })
    write(mcp.error_response(nil, mcp.INVALID_REQUEST, 'the message is over the size cap (' .. max .. ' bytes)'))
  end)
  task.await(function(done)
    input:read_start(function(err, data)
      if err or not data then
        input:read_stop()
        done()
        return
      end
      feed(data)
    end)
  end)
  if not input:is_closing() then input:close() end
  session:close('disconnect')
  server:close('stdin ended')
  if out_handle and not out_handle:is_closing() then
    task.await(function(done)
      -- let written answers drain before closing
      out_handle:shutdown(function() done() end)
    end)
    out_handle:close()
  end
end

return M
