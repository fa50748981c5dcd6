--- mayura.mcp.stdio: the MCP stdio transport, one session over standard input and output.
--
--   require('mayura.mcp.stdio').serve(server, { max_message_bytes = 1048576 })   -- in a task
--
-- Messages are lines of JSON (UTF-8, no embedded newline) on stdin; answers
-- and notifications are written to stdout one per line, and nothing else is
-- (logs go to stderr). A line longer than `max_message_bytes` is dropped as
-- it streams in (never held whole) and answered with -32600; malformed
-- JSON gets -32700: the session goes on. Standard input may be a pipe, a
-- terminal, a socket or a file (`mayura serve < requests.jsonl`, `< /dev/null`).
-- When it ends, every request already read is answered (a call still running
-- after `drain_ms`, 30 s, is cancelled: its commands stopped), then the
-- session is closed (its sandbox released) and `serve` returns once the
-- answers are written.
local uv = require('luv')
local core = require('mayura.core')
local task = require('mayura._task')
local mcp = require('mayura.mcp')

local json = core.json

local M = {}

-- A stream handle of fd (a terminal, a pipe or a socket), or nil for a file (read and written
-- with plain fs calls).
local function open_handle(fd, readable)
  local kind = uv.guess_handle(fd)
  if kind == 'tty' then return uv.new_tty(fd, readable) end
  if kind == 'pipe' or kind == 'tcp' then
    local h = kind == 'pipe' and uv.new_pipe(false) or uv.new_tcp()
    if h:open(fd) then return h end   -- 0, or nil and the error
    h:close()
  end
  return nil, kind
end

-- Reads fd (a file) to its end, a piece at a time, into on_data; returns at the end.
local function read_file_fd(fd, on_data)
  while true do
    local data = task.await(function(done)
      uv.fs_read(fd, 65536, -1, function(err, chunk) done(not err and chunk or '') end)
    end)
    if data == '' then return end
    on_data(data)
  end
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
  local drain_ms = options.drain_ms or 30000
  local input_fd = options.input_fd or 0
  local input = open_handle(input_fd, true)
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
  local pending, drained = 0, nil   -- requests read and not yet answered; who waits for none
  local out = {
    send = write,
    reply = function(msg)
      if msg ~= nil then write(msg) end
      pending = pending - 1
      if pending == 0 and drained then drained() end
    end,
  }
  local feed = M.line_splitter(max, function(line)
    pending = pending + 1
    session:handle(line, out)
  end, function()
    server:log({ event = 'bad_message', session = session.id, message = 'a message over ' .. max .. ' bytes' })
    write(mcp.error_response(nil, mcp.INVALID_REQUEST, 'the message is over the size cap (' .. max .. ' bytes)'))
  end)
  if input then
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
  else
    read_file_fd(input_fd, feed)
  end
  -- the end of input: what was asked is answered first (within drain_ms)
  if pending > 0 then
    task.await(function(done)
      local timer = task.after(drain_ms, function() if drained then drained() end end, true)
      drained = function()
        drained = nil
        timer.cancel()
        done()
      end
    end)
  end
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
