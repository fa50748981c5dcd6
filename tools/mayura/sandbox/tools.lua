--- mayura.sandbox.tools: tools that let an agent work in a sandbox.
--
--   local tools = sandbox.sandbox_tools(per_run.source, { name = 'workspace', exec = true, write = true })
--
-- Only reading is on by default; each further power has its own option and
-- its own permission (`sandbox:<name>:<read|exec|write|ports|desktop|snapshot>`):
--
--   <name>.read    always      read { path, offset, length }: text as text, other bytes as base64, in parts
--   <name>.list    always      list { path }: a directory's entries
--   <name>.exec    exec=true   exec { command, cwd, timeout_ms }: `sh -c command`
--   <name>.write   write=true  write { path, text } or { path, base64 }
--   <name>.remove  write=true  remove { path, recursive }
--   <name>.url     ports=true  url { port }
--   <name>.screenshot, .click, .scroll, .type, .key   desktop=true
--   <name>.checkpoint   snapshots=true   checkpoint {}: keeps the workspace's files (the sandbox's
--                       snapshot, held until the run's sandbox is released), names it
--   <name>.restore      snapshots=true   restore { checkpoint }: puts those files back (what was made
--                       since is gone; running processes go on)
--
-- read, list, url, screenshot and checkpoint have the read effect; the others write. Checkpoints
-- count against the pool's max_snapshots and max_snapshot_bytes (past them the model is told
-- LIMIT_EXCEEDED); at most 16 per sandbox, and a model may drop one with
-- `restore { checkpoint, drop = true }` after going back to it.
-- Options: `exec_timeout_ms` (300000: the longest a command may run, and the
-- default; a pool whose `max_exec_timeout_ms` is lower lowers the default to
-- it, while an explicit value above it is INVALID_CONFIG, as the pool's own
-- `exec_timeout_ms` is), `exec_cost_micros` (0: what one call of exec is charged against a
-- run's budget), `max_output_bytes` (32768 of each of stdout and stderr; the
-- middle of longer output is left out, with a marker saying how much),
-- `max_read_bytes` (65536 per read; longer files are read in parts with
-- `offset`, following `next_offset` until `eof`), `max_write_bytes` (1 MiB).
--
-- `source` is a sandbox, or a per-run source (a table whose `get(context)`
-- gives the run's sandbox; the sandbox is asked for only when a tool runs).
-- Problems the model can fix (a missing file, a bad offset, too much data)
-- raise INVALID_INPUT or NOT_FOUND, which a run hands back to the model.
-- What the sandbox or its pool refuses (a read-only path or an unreadable
-- file: PERMISSION_DENIED; a full disk, a file too large, the pool's limits:
-- LIMIT_EXCEEDED; a failed provider: SANDBOX_ERROR) is handed back too, with
-- its code and message: the tools mark it `tool_error`, so that only a
-- missing grant, the run's own limits and budget, or a cancel end the run.
-- Text given to the model is valid UTF-8: a command's output has invalid
-- bytes replaced by U+FFFD.
--
-- Progress: when the tool context has `progress(update)` (a run's does: each
-- update becomes a `tool_output` event, mayura.runtime), exec passes the
-- command's output on as it comes, `{ stream = 'stdout' | 'stderr', text }`,
-- the first max_output_bytes of each stream (each chunk made valid UTF-8 on its
-- own, so a character cut between two chunks shows as U+FFFD).
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local z = require('mayura.z')

local M = {}

local base64 = core.base64
local array_mt = core.json.array_mt

local MAX_LIST_ENTRIES = 1000
local MAX_CHECKPOINTS = 16
local REPLACEMENT = '\239\191\189'

-- {======================================================
-- Text
-- =======================================================

-- The length of the valid UTF-8 sequence starting at byte i, or nil.
local function sequence_at(s, i)
  local c = s:byte(i)
  local len
  if c < 0x80 then return 1
  elseif c >= 0xC2 and c <= 0xDF then len = 2
  elseif c >= 0xE0 and c <= 0xEF then len = 3
  elseif c >= 0xF0 and c <= 0xF4 then len = 4
  else return nil end
  for k = 1, len - 1 do
    local b = s:byte(i + k)
    if not b or b < 0x80 or b > 0xBF then return nil end
  end
  local b2 = s:byte(i + 1)
  if (c == 0xE0 and b2 < 0xA0) or (c == 0xED and b2 > 0x9F)
    or (c == 0xF0 and b2 < 0x90) or (c == 0xF4 and b2 > 0x8F) then
    return nil
  end
  return len
end

-- Whether `s` is valid UTF-8.
local function valid_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local j = s:find('[\128-\255]', i)
    if not j then return true end
    local len = sequence_at(s, j)
    if not len then return false end
    i = j + len
  end
  return true
end

--- Whether `s` is text: valid UTF-8 without NUL bytes.
function M.is_text(s)
  return not s:find('\0', 1, true) and valid_utf8(s)
end

--- `s` with every byte that is not part of valid UTF-8 replaced by U+FFFD.
function M.to_text(s)
  if valid_utf8(s) then return s end
  local out, i, n, from = {}, 1, #s, 1
  while i <= n do
    local j = s:find('[\128-\255]', i)
    if not j then break end
    local len = sequence_at(s, j)
    if len then
      i = j + len
    else
      out[#out + 1] = s:sub(from, j - 1)
      out[#out + 1] = REPLACEMENT
      i = j + 1
      from = i
    end
  end
  out[#out + 1] = s:sub(from)
  return table.concat(out)
end

local function is_continuation(s, i)
  local b = s:byte(i)
  return b ~= nil and b >= 0x80 and b <= 0xBF
end

--- `s` cut to at most `max` of its bytes, the middle left out with a marker
-- (cuts fall between UTF-8 characters); returns the text and whether it was cut.
function M.cut_middle(s, max)
  local n = #s
  if n <= max then return s, false end
  local head = math.floor(max / 2)
  local tail_start = n - (max - head) + 1
  for _ = 1, 3 do
    if head > 0 and is_continuation(s, head + 1) then head = head - 1 end
  end
  for _ = 1, 3 do
    if tail_start <= n and is_continuation(s, tail_start) then tail_start = tail_start + 1 end
  end
  local left_out = tail_start - head - 1
  return s:sub(1, head) .. '\n[... ' .. left_out .. ' bytes left out ...]\n' .. s:sub(tail_start), true
end

-- }======================================================

-- {======================================================
-- The tools
-- =======================================================

local option_keys = {
  name = true, exec = true, write = true, ports = true, desktop = true, snapshots = true, exec_timeout_ms = true,
  exec_cost_micros = true, max_output_bytes = true, max_read_bytes = true, max_write_bytes = true,
}

local function flag(v, what)
  if v ~= nil and type(v) ~= 'boolean' then errors.raise('INVALID_CONFIG', what .. ' must be a boolean', nil, 4) end
  return v == true
end

local function not_found(what, path)
  errors.raise('NOT_FOUND', 'there is no ' .. what .. ' at ' .. path, nil, 3)
end

-- `run` with every coded error it raises marked `tool_error`, for the run to hand it back to the
-- model: a refusal of the sandbox is not a missing grant, nor the run's own limit. A cancel stays a
-- cancel (the run's, or its duration limit's, which the run itself reports).
local function handed_back(run)
  return function(input, context)
    local ok, res = pcall(run, input, context)
    if ok then return res end
    if errors.is(res) and res.code ~= 'CANCELLED' then res.tool_error = true end
    error(res, 0)
  end
end

-- The max_exec_timeout_ms of the pool `source` (a sandbox, or a per-run source) comes from, when known.
local function max_exec_timeout_of(source)
  local pool = source._pool or source.pool
  if type(pool) == 'table' and check.is_int(pool.max_exec_timeout_ms) then return pool.max_exec_timeout_ms end
  return nil
end

--- The tools over `source` (a sandbox or a per-run source); see the module comment for the options.
function M.sandbox_tools(source, options)
  if type(source) == 'table' and type(source.get) ~= 'function' and type(source.exec) ~= 'function'
    and type(source.source) == 'table' then
    source = source.source   -- the per-run object itself
  end
  if type(source) ~= 'table' or (type(source.get) ~= 'function' and type(source.exec) ~= 'function') then
    errors.raise('INVALID_CONFIG', 'sandbox_tools expects a sandbox or a per-run source', nil, 2)
  end
  if type(options) ~= 'table' then
    errors.raise('INVALID_CONFIG', 'sandbox_tools expects options with a name', nil, 2)
  end
  check.keys(options, option_keys, 'sandbox_tools options', 'INVALID_CONFIG', 3)
  local name = options.name
  if type(name) ~= 'string' or not name:match('^[%a][%w_%-]*$') or #name > 64 then
    errors.raise('INVALID_CONFIG', 'name must start with a letter and hold only letters, digits, _ and -', nil, 2)
  end
  local C = 'INVALID_CONFIG'
  local exec_timeout_ms = check.int(options.exec_timeout_ms, 'exec_timeout_ms', 1, nil, C, 3, 300000)
  -- The pool's max_exec_timeout_ms is the longest any command of its sandboxes may run. The default
  -- of 5 minutes comes down to it, so that a pool with a lower maximum still runs commands; a value
  -- given above it is refused here, at setup, as the pool refuses its own exec_timeout_ms above its
  -- maximum: that configuration could never be honoured, and every command would fail at run time.
  local pool_max = max_exec_timeout_of(source)
  if pool_max and exec_timeout_ms > pool_max then
    if options.exec_timeout_ms ~= nil then
      errors.raise(C, 'exec_timeout_ms (' .. exec_timeout_ms .. ') is above the pool\'s max_exec_timeout_ms ('
        .. pool_max .. ')', nil, 2)
    end
    exec_timeout_ms = pool_max
  end
  local exec_cost = check.int(options.exec_cost_micros, 'exec_cost_micros', 0, nil, C, 3, 0)
  local max_output = check.int(options.max_output_bytes, 'max_output_bytes', 1, nil, C, 3, 32768)
  local max_read = check.int(options.max_read_bytes, 'max_read_bytes', 1, nil, C, 3, 65536)
  local max_write = check.int(options.max_write_bytes, 'max_write_bytes', 0, nil, C, 3, 1048576)
  local want_exec = flag(options.exec, 'exec')
  local want_write = flag(options.write, 'write')
  local want_ports = flag(options.ports, 'ports')
  local want_desktop = flag(options.desktop, 'desktop')
  local want_snapshots = flag(options.snapshots, 'snapshots')

  local sandbox_of
  if type(source.exec) == 'function' then
    sandbox_of = function() return source end
  else
    sandbox_of = function(context) return source:get(context or {}) end
  end

  local function cap(what) return { 'sandbox:' .. name .. ':' .. what } end
  local path = z.string():min(1):max(4096)

  local tools = {}
  local function add(t)
    t.run = handed_back(t.run)
    tools[#tools + 1] = t
  end

  add({
    id = name .. '.read',
    description = 'Reads a file in the ' .. name .. ' sandbox. Text comes back as `text`, other bytes as `base64`.'
      .. ' At most ' .. max_read .. ' bytes come back per call: while `eof` is false, call again with'
      .. ' `offset` = `next_offset` for the next part.',
    input = z.object({
      path = path:describe('The file: absolute, or relative to the working directory.'),
      offset = z.integer():min(0):optional():describe('The byte to start at (0 by default).'),
      length = z.integer():min(1):max(max_read):optional()
        :describe('The most bytes to read (' .. max_read .. ' by default).'),
    }),
    capabilities = cap('read'),
    effect = 'read',
    run = function(input, context)
      local sb = sandbox_of(context)
      local ok, data = pcall(sb.read_file, sb, input.path)
      if not ok then
        if errors.is(data, 'LIMIT_EXCEEDED') then
          errors.raise('INVALID_INPUT', input.path .. ' is larger than this sandbox reads')
        end
        error(data, 0)
      end
      if data == nil then not_found('file', input.path) end
      local size = #data
      local offset = input.offset or 0
      if offset > size then
        errors.raise('INVALID_INPUT', 'offset ' .. offset .. ' is past the end of the file (' .. size .. ' bytes)')
      end
      local stop = math.min(offset + (input.length or max_read), size)
      local text_file = M.is_text(data)
      if text_file and stop < size then
        local s = stop
        for _ = 1, 3 do
          if s > offset and is_continuation(data, s + 1) then s = s - 1 end
        end
        if s > offset then stop = s end
      end
      local part = data:sub(offset + 1, stop)
      local result = { path = input.path, size = size, offset = offset, length = #part, eof = stop >= size }
      if stop < size then result.next_offset = stop end
      if text_file and M.is_text(part) then
        result.encoding = 'text'
        result.text = part
      else
        result.encoding = 'base64'
        result.base64 = base64.encode(part)
      end
      return result
    end,
  })

  add({
    id = name .. '.list',
    description = 'Lists a directory in the ' .. name .. ' sandbox: each entry\'s name, type, size and modified'
      .. ' time (ms since the epoch).',
    input = z.object({
      path = path:optional():describe('The directory (the working directory by default).'),
    }),
    capabilities = cap('read'),
    effect = 'read',
    run = function(input, context)
      local sb = sandbox_of(context)
      local dir = input.path or '.'
      local entries = sb:list_files(dir)
      if entries == nil then not_found('directory', dir) end
      table.sort(entries, function(a, b) return a.name < b.name end)
      local out = setmetatable({}, array_mt)
      for i = 1, math.min(#entries, MAX_LIST_ENTRIES) do out[i] = entries[i] end
      return { path = dir, entries = out, truncated = #entries > MAX_LIST_ENTRIES }
    end,
  })

  if want_exec then
    add({
      id = name .. '.exec',
      description = 'Runs a shell command with `sh -c` in the ' .. name .. ' sandbox and gives its exit code,'
        .. ' stdout and stderr (at most ' .. max_output .. ' bytes of each; the middle of longer output is left'
        .. ' out). A command still running at its timeout is stopped (`timed_out`). Start a server that must'
        .. ' outlive its command with setsid.',
      input = z.object({
        command = z.string():min(1):max(65536):describe('The shell command.'),
        cwd = path:optional():describe('The directory to run it in (the working directory by default).'),
        timeout_ms = z.integer():min(1):max(exec_timeout_ms):optional()
          :describe('How long it may run, in ms (' .. exec_timeout_ms .. ' by default).'),
      }),
      capabilities = cap('exec'),
      effect = 'write',
      exec_cost_micros = exec_cost,
      run = function(input, context)
        local sb = sandbox_of(context)
        -- a source whose pool was not known at setup (a source of your own) is held to it here
        local timeout = input.timeout_ms or exec_timeout_ms
        local max = max_exec_timeout_of(sb)
        if max and timeout > max then timeout = max end
        local opts = { cwd = input.cwd, timeout_ms = timeout, signal = context and context.signal or nil }
        local progress = context and context.progress
        if type(progress) == 'function' then
          -- the output as it comes, to the run's listeners: the first max_output bytes of each stream
          local sent = { stdout = 0, stderr = 0 }
          local function pass(which)
            return function(chunk)
              local room = max_output - sent[which]
              if room <= 0 then return end
              if #chunk > room then chunk = chunk:sub(1, room) end
              sent[which] = sent[which] + #chunk
              progress({ stream = which, text = M.to_text(chunk) })
            end
          end
          opts.on_stdout, opts.on_stderr = pass('stdout'), pass('stderr')
        end
        local r = sb:exec({ 'sh', '-c', input.command }, opts)
        local stdout, cut_out = M.cut_middle(r.stdout, max_output)
        local stderr, cut_err = M.cut_middle(r.stderr, max_output)
        return {
          exit_code = r.exit_code,
          stdout = M.to_text(stdout),
          stderr = M.to_text(stderr),
          timed_out = r.timed_out == true,
          truncated = r.truncated == true or cut_out or cut_err,
        }
      end,
    })
  end

  if want_write then
    add({
      id = name .. '.write',
      description = 'Writes a file in the ' .. name .. ' sandbox, creating its directories and replacing what'
        .. ' is there. Give `text`, or `base64` for other bytes (at most ' .. max_write .. ' bytes).',
      input = z.object({
        path = path:describe('The file: absolute, or relative to the working directory.'),
        text = z.string():max(max_write):optional():describe('The content, as text.'),
        base64 = z.string():max(math.ceil(max_write / 3) * 4 + 4):optional()
          :describe('The content, as base64, for bytes that are not text.'),
      }),
      capabilities = cap('write'),
      effect = 'write',
      run = function(input, context)
        if (input.text == nil) == (input.base64 == nil) then
          errors.raise('INVALID_INPUT', 'give exactly one of text and base64')
        end
        local data = input.text
        if data == nil then
          local decoded, err = base64.decode(input.base64)
          if decoded == nil then
            errors.raise('INVALID_INPUT', 'base64: ' .. tostring(err and err.message or err))
          end
          data = decoded
        end
        if #data > max_write then
          errors.raise('INVALID_INPUT', 'the content is ' .. #data .. ' bytes, more than max_write_bytes ('
            .. max_write .. ')')
        end
        local sb = sandbox_of(context)
        sb:write_file(input.path, data)
        return { path = input.path, bytes = #data }
      end,
    })
    add({
      id = name .. '.remove',
      description = 'Removes a file in the ' .. name .. ' sandbox; a directory with what is in it needs'
        .. ' `recursive`.',
      input = z.object({
        path = path:describe('The file or directory.'),
        recursive = z.boolean():optional():describe('Remove a directory and everything in it.'),
      }),
      capabilities = cap('write'),
      effect = 'write',
      run = function(input, context)
        local sb = sandbox_of(context)
        sb:remove_file(input.path, { recursive = input.recursive == true })
        return { path = input.path, removed = true }
      end,
    })
  end

  if want_ports then
    add({
      id = name .. '.url',
      description = 'Gives the URL serving a port of the ' .. name .. ' sandbox (one of the ports it was made with).',
      input = z.object({ port = z.integer():min(1):max(65535):describe('The port.') }),
      capabilities = cap('ports'),
      effect = 'read',
      run = function(input, context)
        local sb = sandbox_of(context)
        return { port = input.port, url = sb:url(input.port) }
      end,
    })
  end

  if want_desktop then
    local function desktop(context)
      local sb = sandbox_of(context)
      if not sb.desktop then errors.raise('INVALID_INPUT', 'the ' .. name .. ' sandbox has no desktop', nil, 3) end
      return sb.desktop
    end
    local function act(id, description, input, call)
      add({
        id = name .. '.' .. id,
        description = description,
        input = input,
        capabilities = cap('desktop'),
        effect = id == 'screenshot' and 'read' or 'write',
        run = function(args, context)
          return call(desktop(context), args)
        end,
      })
    end
    local xy = z.integer():min(0)
    act('screenshot', 'Takes a screenshot of the ' .. name .. ' sandbox\'s desktop (a PNG, as base64).',
      z.object({}), function(d)
        local png = d:screenshot()
        return { media_type = 'image/png', encoding = 'base64', base64 = base64.encode(png) }
      end)
    act('click', 'Clicks at a point of the ' .. name .. ' sandbox\'s desktop.',
      z.object({ x = xy, y = xy, button = z.enum({ 'left', 'right', 'middle' }):optional() }), function(d, a)
        d:click({ x = a.x, y = a.y, button = a.button or 'left' })
        return { done = true }
      end)
    act('scroll', 'Scrolls the ' .. name .. ' sandbox\'s desktop, at a point when given.',
      z.object({
        direction = z.enum({ 'up', 'down', 'left', 'right' }),
        amount = z.integer():min(1):max(100):optional(),
        x = xy:optional(), y = xy:optional(),
      }), function(d, a)
        d:scroll({ direction = a.direction, amount = a.amount or 1, x = a.x, y = a.y })
        return { done = true }
      end)
    act('type', 'Types text on the ' .. name .. ' sandbox\'s desktop.',
      z.object({ text = z.string():max(10000) }), function(d, a)
        d:type(a.text)
        return { done = true }
      end)
    act('key', 'Presses a key (such as Enter, ctrl+c) on the ' .. name .. ' sandbox\'s desktop.',
      z.object({ name = z.string():min(1):max(64) }), function(d, a)
        d:key(a.name)
        return { done = true }
      end)
  end

  if want_snapshots then
    -- each sandbox's checkpoints: { n = the last number, names = in order, snaps = by name }, gone with it
    local checkpoints = setmetatable({}, { __mode = 'k' })
    local function held(sb)
      local c = checkpoints[sb]
      if not c then
        c = { n = 0, names = {}, snaps = {} }
        checkpoints[sb] = c
      end
      return c
    end
    add({
      id = name .. '.checkpoint',
      description = 'Keeps the files of the ' .. name .. ' sandbox (its working directory and /tmp) as a'
        .. ' checkpoint, to go back to with ' .. name .. '.restore before or after a risky change. Running'
        .. ' processes are not kept. At most ' .. MAX_CHECKPOINTS .. ' checkpoints.',
      input = z.object({}),
      capabilities = cap('snapshot'),
      effect = 'read',
      run = function(_, context)
        local sb = sandbox_of(context)
        local c = held(sb)
        if #c.names >= MAX_CHECKPOINTS then
          errors.raise('LIMIT_EXCEEDED', 'there are ' .. MAX_CHECKPOINTS .. ' checkpoints already: drop one with '
            .. name .. '.restore { checkpoint, drop = true }')
        end
        local snap = sb:snapshot({ until_release = true })
        c.n = c.n + 1
        local id = 'checkpoint-' .. c.n
        c.snaps[id] = snap
        c.names[#c.names + 1] = id
        return { checkpoint = id, size_bytes = snap.size_bytes }
      end,
    })
    add({
      id = name .. '.restore',
      description = 'Puts the files of the ' .. name .. ' sandbox back as they were at a checkpoint: what was'
        .. ' written since is gone. With `drop`, the checkpoint is let go of after.',
      input = z.object({
        checkpoint = z.string():min(1):max(64):describe('The checkpoint, as ' .. name .. '.checkpoint named it.'),
        drop = z.boolean():optional():describe('Let go of the checkpoint once the files are back.'),
      }),
      capabilities = cap('snapshot'),
      effect = 'write',
      run = function(input, context)
        local sb = sandbox_of(context)
        local c = held(sb)
        local snap = c.snaps[input.checkpoint]
        if not snap then
          errors.raise('NOT_FOUND', 'there is no checkpoint ' .. input.checkpoint)
        end
        sb:restore(snap)
        if input.drop then
          c.snaps[input.checkpoint] = nil
          for i, n in ipairs(c.names) do
            if n == input.checkpoint then table.remove(c.names, i) break end
          end
          snap:release()
        end
        return { checkpoint = input.checkpoint, restored = true, dropped = input.drop == true }
      end,
    })
  end

  return tools
end

-- }======================================================

return M
