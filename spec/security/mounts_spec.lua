-- What a sandbox's mount tables tell of its host, on every provider here: /proc/self/mountinfo,
-- /proc/1/mountinfo and /proc/mounts, read by a command and through the file calls, name no path
-- of the host's: not this checkout, its build directory or the agent in it, not the directory of
-- the sandbox's socket or the base it lives in, not the host's home or temporary directory.
local providers = require('support.providers')
local host_util = require('mayura.sandbox._host')

local function absolute(path)
  if path:sub(1, 1) == '/' then return path end
  local pwd = io.popen('pwd'):read('l')
  return pwd .. '/' .. path:gsub('^%./', '')
end

-- The host's paths that must not show, each with what it is.
local function host_paths(sb, provider)
  local out = {}
  local function add(what, path)
    if type(path) == 'string' and #path > 1 and path:sub(1, 1) == '/' then
      out[#out + 1] = { what = what, path = path:gsub('/+$', '') }
    end
  end
  add('the checkout', absolute('.'))
  add('the build directory', absolute(os.getenv('MAYURA_BUILD') or 'build'))
  add('the agent', host_util.find_agent())
  add('the run directories', '/run/mayura')
  add('the user\'s runtime directory', os.getenv('XDG_RUNTIME_DIR'))
  add('the home directory', os.getenv('HOME'))
  local b = sb._backend or {}
  add('the socket directory', b.dir)
  add('the socket directories\' base', provider and provider.run_base)
  return out
end

-- Where `path` appears in `text` as a path (followed by '/', blank, ',', ':' or the end).
local function names(text, path)
  local at = 1
  while true do
    local i, j = text:find(path, at, true)
    if not i then return nil end
    local after = text:sub(j + 1, j + 1)
    if after == '' or after:match('[/%s,:]') then return i end
    at = j + 1
  end
end

-- The host's temporary directory as a mount's source: mountinfo's root and source fields and its
-- options (not where a mount is: the sandbox's own /tmp is a mount of its own), /proc/mounts' source
-- and options.
local function tmp_sources(text, tmp)
  local found = {}
  for line in text:gmatch('[^\n]+') do
    local fields = {}
    for f in line:gmatch('%S+') do fields[#fields + 1] = f end
    local looked = {}
    local dash
    for i, f in ipairs(fields) do if f == '-' then dash = i break end end
    if dash then   -- mountinfo: id parent dev root point options ... - type source options
      looked = { fields[4], fields[dash + 2], fields[dash + 3] }
    elseif #fields >= 4 then   -- /proc/mounts: source point type options
      looked = { fields[1], fields[4] }
    end
    for _, f in ipairs(looked) do
      if f and (names(f, tmp) == 1 or f:find('=' .. tmp .. '/', 1, true) or f:find(':' .. tmp .. '/', 1, true)) then
        found[#found + 1] = line
      end
    end
  end
  return found
end

for _, prov in ipairs(providers.list()) do
  describe('what a sandbox\'s mount tables tell of the host (' .. prov.name .. ')', function()
    local pool, provider, sb
    setup(function()
      pool, provider = prov.make_pool({ max_sandboxes = 1 })
      sb = pool:create({ lifetime_ms = 120000 })
    end)
    teardown(function()
      if sb then sb:release() end
      pool:close()
    end)

    it('names no host path of the checkout, the agent, the run directory, home or tmp', function()
      local tables = {}
      for _, file in ipairs({ '/proc/self/mountinfo', '/proc/1/mountinfo', '/proc/mounts' }) do
        local r = sb:exec({ 'cat', file })
        -- PID 1's may be closed to the sandbox's user (the agent is not dumpable): then it tells nothing
        if r.exit_code == 0 then tables[#tables + 1] = { file = file .. ' (cat)', text = r.stdout } end
        local ok, text = pcall(sb.read_file, sb, file)
        if ok and type(text) == 'string' then tables[#tables + 1] = { file = file .. ' (read_file)', text = text } end
      end
      assert.is_true(#tables >= 4, 'the mount tables could not be read')
      for _, t in ipairs(tables) do
        assert.is_truthy(t.text:find(' /proc ', 1, true) or t.text:find(' /proc proc', 1, true),
          t.file .. ' is not a mount table')
        for _, p in ipairs(host_paths(sb, provider)) do
          local at = names(t.text, p.path)
          assert.is_nil(at, t.file .. ' names ' .. p.what .. ' (' .. p.path .. '): ' ..
            (at and t.text:sub(math.max(1, at - 60), at + #p.path + 20) or ''))
        end
        local tmp = (os.getenv('TMPDIR') or '/tmp'):gsub('/+$', '')
        local lines = tmp_sources(t.text, tmp)
        assert.are.equal(0, #lines, t.file .. ' names the host\'s ' .. tmp .. ': ' .. table.concat(lines, '\n'))
      end
    end)
  end)
end
