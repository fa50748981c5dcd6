-- Files moved in parts between the host and the agent (mayura.sandbox._agent_files' read_file and
-- write_file over the agent's ranged read and upload): through a local sandbox, with the part size
-- made small so that a few bytes take several parts.
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local agent_files = require('mayura.sandbox._agent_files')

local provider = local_provider.local_sandboxes({ memory_mib = 256, pids = 64, tmp_mib = 2, workspace_mib = 16 })

describe('files in parts through the agent', function()
  local pool, sb
  local part = agent_files.FILE_PART_BYTES
  setup(function()
    pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000, max_file_bytes = 4194304 })
    sb = pool:create({ lifetime_ms = 600000 })
  end)
  teardown(function()
    agent_files.FILE_PART_BYTES = part
    pool:close()
  end)
  after_each(function() agent_files.FILE_PART_BYTES = part end)

  local function names(dir)
    return sb:exec({ 'sh', '-c', 'ls -A ' .. dir }).stdout
  end

  it('moves a file of several parts whole, at part boundaries too, leaving no temporary file', function()
    agent_files.FILE_PART_BYTES = 5
    for _, data in ipairs({ '', 'abc', 'abcde', string.rep('0123456789', 2), string.rep('xyz', 7) .. '\0\255' }) do
      sb:write_file('parts/f', data)
      assert.are.equal(data, sb:read_file('parts/f'))
      assert.are.equal(data, sb:exec({ 'cat', 'parts/f' }).stdout)
    end
    assert.are.equal('f\n', names('parts'))
    assert.raises_code('LIMIT_EXCEEDED', sb.read_file, sb, 'parts/f', { max_bytes = 22 })
    assert.is_nil(sb:read_file('parts/none'))
  end)

  it('joins more parts than one expression takes (a part of one byte, 300 of them)', function()
    local bytes = {}
    for i = 1, 300 do bytes[i] = string.char(i % 256) end
    local data = table.concat(bytes)
    sb:write_file('parts/many', data)
    agent_files.FILE_PART_BYTES = 1
    assert.are.equal(data, sb:read_file('parts/many'))
  end)

  it('reads again from the start when the file is replaced between parts', function()
    agent_files.FILE_PART_BYTES = 4
    sb:write_file('parts/g', 'old content here')
    local backend = sb._backend
    local call, replaced = backend.call, false
    backend.call = function(self, req, ...)
      local reply = call(self, req, ...)
      if req.op == 'read' and not replaced then
        replaced = true
        call(self, { op = 'write', path = 'parts/g', data = 'the new content, longer' })
      end
      return reply
    end
    local ok, data = pcall(sb.read_file, sb, 'parts/g')
    backend.call = nil   -- the class's method again
    assert.is_true(ok, tostring(data))
    assert.is_true(replaced)
    assert.are.equal('the new content, longer', data)
  end)

  it('keeps the old file and leaves no temporary file when a later part finds no space', function()
    -- /tmp is a 2 MiB tmpfs: the first 1 MiB part fits, the third does not
    sb:write_file('/tmp/h', 'old')
    assert.raises_code('LIMIT_EXCEEDED', sb.write_file, sb, '/tmp/h', string.rep('n', 3 * 1048576))
    assert.are.equal('old', sb:read_file('/tmp/h'))
    assert.are.equal('h\n', names('/tmp'))
    -- the space is back: a write that fits goes through
    sb:write_file('/tmp/h', string.rep('y', 1048576 + 10))
    assert.are.equal(1048576 + 10, #sb:read_file('/tmp/h'))
  end)
  it('takes a size the agent lies about (huge, infinite, fractional) as a size, not as a hint it chokes on', function()
    agent_files.FILE_PART_BYTES = 4
    sb:write_file('parts/lie', 'twelve bytes')
    local backend = sb._backend
    local call = backend.call
    local function lying(size)
      backend.call = function(self, req, ...)
        local reply = call(self, req, ...)
        if req.op == 'read' then reply.size = size end
        return reply
      end
    end
    for _, size in ipairs({ 2 ^ 60, 1 / 0, 1048576 * 3.5, 1024 * 1048576 }) do
      -- through the backend itself, with no max_bytes, and through the sandbox, with its max: the
      -- size only tells one file from another, so the bytes that came are the file
      lying(size)
      local ok, data = pcall(backend.read_file, backend, 'parts/lie', {})
      backend.call = nil
      assert.is_true(ok, tostring(data))
      assert.are.equal('twelve bytes', data)
      lying(size)
      ok, data = pcall(sb.read_file, sb, 'parts/lie')
      backend.call = nil
      assert.is_true(ok, tostring(data))
      assert.are.equal('twelve bytes', data)
    end
  end)
end)
