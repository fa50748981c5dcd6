--- A sandbox provider written in one file, the way a user would write one:
-- each "sandbox" is a directory on the host and commands run there with
-- core.spawn. It isolates nothing; the specs use it to test the pool's
-- contract (validation, limits, lifetimes) apart from any real isolation.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')

local M = {}

local function await_cb(start)
  return task.await(function(done) start(function(a, b) done(a, b) end) end)
end

--- dir_sandboxes{ features = ..., delay_ms = n, fail_create = bool, hang = { op = true },
--   hold_release = token }: with `hold_release` (a cancel token), a release ends only once the
--   token is cancelled.
function M.dir_sandboxes(opts)
  opts = opts or {}
  local provider = {
    id = 'dir',
    -- no snapshots: its commands see the host's own /tmp and /
    features = opts.features or { stdin = true, ports = true, desktop = false, network = { 'none', 'all' },
      snapshots = false },
    workdir = '/workspace',
    max_lifetime_ms = opts.max_lifetime_ms or 3600000,
    created = {},
    specs = {},
  }
  local counter = 0

  function provider.create(_, spec)
    provider.specs[#provider.specs + 1] = spec
    if opts.delay_ms then task.sleep(opts.delay_ms) end
    if opts.fail_create then error(errors.sandbox('unavailable', 'the test provider refuses')) end
    if opts.raw_fail then error('provider text with /secret/host/path') end
    counter = counter + 1
    local root = os.tmpname()
    os.remove(root)
    local ok = await_cb(function(cb) core.fs.mkdir(root .. '/workspace', nil, cb) end)
    assert(ok)
    local hang = opts.hang or {}
    local backend = { id = 'dir-' .. counter, root = root, released = false }
    local function host(path) return root .. path end
    local function maybe_hang(op) if hang[op] then task.sleep(1500) end end
    function backend.exec(_, argv, o)
      maybe_hang('exec')
      local proc
      local res, err = task.await(function(done)
        local env = { PATH = os.getenv('PATH') }
        for k, v in pairs(spec.env or {}) do env[k] = v end
        for k, v in pairs(o.env or {}) do env[k] = v end
        proc = core.spawn({
          argv = argv, cwd = host(o.cwd or '/workspace'), env = env, stdin = o.stdin,
          timeout_ms = o.timeout_ms, max_output_bytes = o.max_output_bytes,
        }, done)
        if o.signal then o.signal:on_cancel(function() proc:cancel() end) end
      end)
      if not res then error(err) end
      if res.cancelled then errors.raise('CANCELLED', 'cancelled') end
      return res
    end
    function backend.read_file(_, path, o)
      maybe_hang('read_file')
      local data, err = await_cb(function(cb) core.fs.read(host(path), { max_bytes = o.max_bytes }, cb) end)
      if err then error(err) end
      return data
    end
    function backend.write_file(_, path, data)
      local ok2, err = await_cb(function(cb) core.fs.write(host(path), data, nil, cb) end)
      if not ok2 then error(err) end
    end
    function backend.list_files(_, path)
      if opts.bad_listing then return { { name = '../escape', type = 'file', size = 1, modified = 0 } } end
      local entries, err = await_cb(function(cb) core.fs.list(host(path), cb) end)
      if err then error(err) end
      return entries
    end
    function backend.remove_file(_, path, o)
      local ok2, err = await_cb(function(cb) core.fs.remove(host(path), { recursive = o.recursive }, cb) end)
      if ok2 == nil then error(err) end
    end
    function backend.url(_, port) return 'http://127.0.0.1:' .. port end
    function backend.release()
      if backend.released or backend.releasing then return end
      backend.releasing = true
      local gate = opts.hold_release
      if gate and not gate.cancelled then task.await(function(done) gate:on_cancel(done) end) end
      backend.released = true
      await_cb(function(cb) core.fs.remove(root, { recursive = true }, cb) end)
    end
    provider.created[#provider.created + 1] = backend
    return backend
  end
  return provider
end

return M
