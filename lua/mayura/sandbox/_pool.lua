--- mayura.sandbox._pool: the sandbox pool, `create_sandboxes(provider, options)`.
--
-- Its options checked, its limits kept (max_sandboxes with the provider's warm sandboxes,
-- lifetimes, network kinds, snapshots), a create checked and run within the call timeout (a
-- sandbox created too late is released at once), the new sandbox's network events, its timer, and
-- the pool's close. mayura.sandbox says what each option and call does; the sandbox object is
-- mayura.sandbox._sandbox's.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local snapshots = require('mayura.sandbox._snapshot')
local checks = require('mayura.sandbox._checks')
local sandbox_object = require('mayura.sandbox._sandbox')
local sandbox_desktop = require('mayura.sandbox._sandbox_desktop')
local pool_snapshots = require('mayura.sandbox._pool_snapshots')

local M = {}

local MIB = 1048576
local NETWORK_KINDS = { none = true, all = true, allowlist = true }
local MAX_EVENTS = 256
local check_network_request, check_env, check_labels = checks.check_network_request, checks.check_env,
  checks.check_labels
local copy_features, has, pack = checks.copy_features, checks.has, checks.pack
local with_deadline, provider_error, bad_reply = checks.with_deadline, checks.provider_error, checks.bad_reply
local check_snapshot, new_desktop = pool_snapshots.check, sandbox_desktop.new

local Pool = {}
Pool.__index = Pool

local pool_keys = {
  max_sandboxes = true, max_lifetime_ms = true, network = true, exec_timeout_ms = true,
  max_exec_timeout_ms = true, max_output_bytes = true, max_file_bytes = true, call_timeout_ms = true,
  labels = true, on_event = true, warm_start = true, max_snapshots = true, max_snapshot_bytes = true,
}

--- Holds every sandbox from `provider` to the same limits.
function M.create_sandboxes(provider, options)
  if type(provider) ~= 'table' or type(provider.create) ~= 'function' then
    errors.raise('INVALID_CONFIG', 'provider must be a sandbox provider (a table with create)', nil, 2)
  end
  if type(options) ~= 'table' then
    errors.raise('INVALID_CONFIG', 'options with max_sandboxes and max_lifetime_ms are required', nil, 2)
  end
  check.keys(options, pool_keys, 'create_sandboxes options', 'INVALID_CONFIG', 3)
  if options.max_sandboxes == nil then errors.raise('INVALID_CONFIG', 'max_sandboxes is required', nil, 2) end
  if options.max_lifetime_ms == nil then errors.raise('INVALID_CONFIG', 'max_lifetime_ms is required', nil, 2) end
  local C = 'INVALID_CONFIG'
  check.int(options.max_sandboxes, 'max_sandboxes', 1, 100000, C, 3)
  check.int(options.max_lifetime_ms, 'max_lifetime_ms', 1, 366 * 86400000, C, 3)
  local provider_max = provider.max_lifetime_ms
  if check.is_int(provider_max) and options.max_lifetime_ms > provider_max then
    errors.raise(C, 'max_lifetime_ms is above the provider\'s (' .. provider_max .. ')', nil, 2)
  end
  local network = options.network
  if network == nil then network = { 'none' } end
  if type(network) ~= 'table' or #network == 0 then
    errors.raise(C, "network must be a list of kinds ('none', 'all', 'allowlist')", nil, 2)
  end
  local kinds = {}
  for i, k in ipairs(network) do
    if not NETWORK_KINDS[k] then errors.raise(C, 'network[' .. i .. '] is not a network kind', nil, 2) end
    kinds[k] = true
  end
  local self = setmetatable({
    provider = provider,
    max_sandboxes = options.max_sandboxes,
    max_lifetime_ms = options.max_lifetime_ms,
    network = kinds,
    exec_timeout_ms = check.int(options.exec_timeout_ms, 'exec_timeout_ms', 1, nil, C, 3, 60000),
    max_exec_timeout_ms = check.int(options.max_exec_timeout_ms, 'max_exec_timeout_ms', 1, nil, C, 3, 1800000),
    max_output_bytes = check.int(options.max_output_bytes, 'max_output_bytes', 0, 1024 * MIB, C, 3, MIB),
    max_file_bytes = check.int(options.max_file_bytes, 'max_file_bytes', 0, 512 * MIB, C, 3, 16 * MIB),
    call_timeout_ms = check.int(options.call_timeout_ms, 'call_timeout_ms', 1, nil, C, 3, 120000),
    labels = check_labels(options.labels, 3),
    on_event = options.on_event,
    max_snapshots = check.int(options.max_snapshots, 'max_snapshots', 0, 100000, C, 3, 16),
    max_snapshot_bytes = check.int(options.max_snapshot_bytes, 'max_snapshot_bytes', 0, 65536 * MIB, C, 3,
      1024 * MIB),
    _snapshots = {},
    _snap_count = 0,   -- held, and being made
    _snap_bytes = 0,   -- the sizes of those held
    _snap_busy = false, _snap_turns = {},   -- a snapshot is being made; those waiting their turn
    workdir = type(provider.workdir) == 'string' and provider.workdir or '/workspace',
    _alive = {},
    _count = 0,
    _closed = false,
  }, Pool)
  if options.on_event ~= nil and type(options.on_event) ~= 'function' then
    errors.raise(C, 'on_event must be a function', nil, 2)
  end
  if self.exec_timeout_ms > self.max_exec_timeout_ms then
    if options.exec_timeout_ms ~= nil then
      errors.raise(C, 'exec_timeout_ms is above max_exec_timeout_ms', nil, 2)
    end
    self.exec_timeout_ms = self.max_exec_timeout_ms   -- the default never passes the cap
  end
  -- a provider with warm sandboxes (its option `warm`) keeps them for this pool, as long as no other
  -- pool holds them: they live max_lifetime_ms, carry the pool's labels and take free slots only
  -- (at once, or with `warm_start = 'first_use'` at the pool's first create: a pool made only to be
  -- checked, as a policy's are, starts nothing)
  if options.warm_start ~= nil and options.warm_start ~= 'now' and options.warm_start ~= 'first_use' then
    errors.raise(C, "warm_start must be 'now' or 'first_use'", nil, 2)
  end
  if type(provider.warm_attach) == 'function' then
    if options.warm_start == 'first_use' then self._warm_later = true else self:_attach_warm() end
  end
  return self
end

function Pool:_attach_warm()
  local provider = self.provider
  local budget = { max_lifetime_ms = self.max_lifetime_ms, labels = self.labels }
  function budget.may_fill()
    return not self._closed and self._count + provider:warm_held() < self.max_sandboxes
  end
  self._warm = provider:warm_attach(budget)
end

-- How many of this pool's slots the provider's warm sandboxes take (ready, starting or ending).
function Pool:_warm_held()
  return self._warm and self.provider:warm_held() or 0
end

local create_keys = {
  lifetime_ms = true, network = true, env = true, ports = true, cpus = true, memory_mib = true,
  image = true, labels = true, desktop = true, snapshot = true,
}

-- The pool forgets a snapshot and frees its room (mayura.sandbox._pool_snapshots).
Pool._release_snapshot = pool_snapshots.release

--- How many snapshots the pool holds, and their bytes together.
Pool.snapshots = pool_snapshots.count

--- Creates a sandbox: `{ lifetime_ms, network, env, ports, cpus, memory_mib, image, labels, desktop,
-- snapshot }`.
function Pool:create(options)
  if self._closed then error(errors.sandbox('closed', 'the pool is closed'), 2) end
  if self._warm_later then
    self._warm_later = nil
    self:_attach_warm()
  end
  if type(options) ~= 'table' then errors.raise('INVALID_INPUT', 'options with lifetime_ms are required', nil, 2) end
  check.keys(options, create_keys, 'create options', 'INVALID_INPUT', 3)
  if options.lifetime_ms == nil then errors.raise('INVALID_INPUT', 'lifetime_ms is required', nil, 2) end
  check.int(options.lifetime_ms, 'lifetime_ms', 1, nil, 'INVALID_INPUT', 3)
  if options.lifetime_ms > self.max_lifetime_ms then
    errors.raise('LIMIT_EXCEEDED', 'lifetime_ms is above max_lifetime_ms (' .. self.max_lifetime_ms .. ')', nil, 2)
  end
  local features = copy_features(self.provider.features)
  local kind, network = check_network_request(options.network)
  -- Asking for nothing means 'none', from any pool: 'none' needs no listing. On a provider that
  -- cannot keep a sandbox offline (no 'none' in its features.network) that fails with INVALID_INPUT
  -- below, never a sandbox online that its creator expected offline.
  if kind == nil then kind, network = 'none', 'none' end
  -- Each kind other than 'none' must be listed; 'none' needs no permission, only a provider that keeps it.
  if kind ~= 'none' and not self.network[kind] then
    errors.raise('PERMISSION_DENIED', "network '" .. kind .. "' is not allowed by this pool", nil, 2)
  end
  if not has(features.network, kind) then
    if options.network == nil then
      errors.raise('INVALID_INPUT', "this provider cannot keep a sandbox offline: ask for one of the pool's kinds",
        nil, 2)
    end
    errors.raise('INVALID_INPUT', "this provider cannot give network '" .. kind .. "'", nil, 2)
  end
  -- events the provider tells before the sandbox object exists wait in `events`
  local events, holder = {}, {}
  local function on_event(event)
    if type(event) ~= 'table' or type(event.type) ~= 'string' then return end
    local e = {}
    for k, v in pairs(event) do
      if type(k) == 'string' and (type(v) == 'string' or type(v) == 'number' or type(v) == 'boolean') then e[k] = v end
    end
    e.sandbox = holder.id
    if #events >= MAX_EVENTS then table.remove(events, 1) end
    events[#events + 1] = e
    if self.on_event then
      local copy = {}
      for k, v in pairs(e) do copy[k] = v end
      local ok, err = pcall(self.on_event, copy)
      if not ok then core.report('the pool\'s on_event failed: ' .. tostring(err)) end
    end
  end
  local spec = {
    lifetime_ms = options.lifetime_ms,
    network = network,
    env = check_env(options.env, 3),
    call_timeout_ms = self.call_timeout_ms,
    on_event = on_event,
  }
  local ports = {}
  if options.ports ~= nil then
    if type(options.ports) ~= 'table' then errors.raise('INVALID_INPUT', 'ports must be a list', nil, 2) end
    if not features.ports and #options.ports > 0 then
      errors.raise('INVALID_INPUT', 'this provider does not serve ports', nil, 2)
    end
    if #options.ports > 64 then errors.raise('INVALID_INPUT', 'at most 64 ports', nil, 2) end
    spec.ports = {}
    for i, port in ipairs(options.ports) do
      check.int(port, 'ports[' .. i .. ']', 1, 65535, 'INVALID_INPUT', 3)
      if not ports[port] then
        ports[port] = true
        spec.ports[#spec.ports + 1] = port
      end
    end
  end
  if options.cpus ~= nil then
    if type(options.cpus) ~= 'number' or options.cpus ~= options.cpus or options.cpus <= 0 or options.cpus > 1024 then
      errors.raise('INVALID_INPUT', 'cpus must be a number above 0', nil, 2)
    end
    spec.cpus = options.cpus
  end
  if options.memory_mib ~= nil then
    spec.memory_mib = check.int(options.memory_mib, 'memory_mib', 1, 16 * 1048576, 'INVALID_INPUT', 3)
  end
  if options.image ~= nil then
    if type(options.image) ~= 'string' or options.image == '' or #options.image > 1024
      or options.image:find('%z') then
      errors.raise('INVALID_INPUT', 'image must be a non-empty string', nil, 2)
    end
    spec.image = options.image
  end
  if options.desktop ~= nil then
    if type(options.desktop) ~= 'boolean' then errors.raise('INVALID_INPUT', 'desktop must be a boolean', nil, 2) end
    if options.desktop and not features.desktop then
      errors.raise('INVALID_INPUT', 'this provider has no desktop', nil, 2)
    end
    spec.desktop = options.desktop
  end
  local snap = options.snapshot ~= nil and check_snapshot(self, options.snapshot, 3) or nil
  -- what the new sandbox starts with: the provider's own snapshot goes to its create, an archive is
  -- unpacked once the sandbox is made (a reference of its own: a release meanwhile does not take it)
  local held = snap and snap._held
  if held and held.native then spec.snapshot = held.native end
  local labels = check_labels(options.labels, 3)
  spec.labels = {}
  for k, v in pairs(self.labels) do spec.labels[k] = v end
  for k, v in pairs(labels) do spec.labels[k] = v end

  local provider = self.provider
  -- a warm sandbox of exactly the asked shape moves from the provider's slots to the pool's; a
  -- create of another shape finding every slot taken makes room by destroying a warm one
  local warm = self._warm and not spec.snapshot and provider:warm_claim(self._warm, spec) or nil
  if not warm and self._count + self:_warm_held() >= self.max_sandboxes then
    if self._warm then provider:warm_evict(self._warm) end
    if self._closed then error(errors.sandbox('closed', 'the pool is closed'), 2) end
    if self._count + self:_warm_held() >= self.max_sandboxes then
      errors.raise('LIMIT_EXCEEDED', 'max_sandboxes (' .. self.max_sandboxes .. ') are alive', nil, 2)
    end
  end
  self._count = self._count + 1
  local started = core.hrtime_ms()
  local returned, handed_late = false, false
  local ok, backend = pcall(with_deadline, self.call_timeout_ms, function()
    local r = pack(pcall(provider.create, provider, spec, warm))
    returned = true
    if not r[1] then error(r[2], 0) end
    return check.unpack(r, 2, r.n)
  end, function(created, late)
    -- created after the pool gave up on it: released at once, and only then is its slot free
    handed_late = true
    if created and type(late) == 'table' and late.release then pcall(late.release, late) end
    self._count = self._count - 1
  end)
  if not ok then
    -- else once the late create has ended; a create that ended as the deadline passed, before this
    -- resumed, went to the late path already and frees its slot there
    if returned and not handed_late then self._count = self._count - 1 end
    error(provider_error(backend), 2)
  end
  if type(backend) ~= 'table' or type(backend.exec) ~= 'function' then
    self._count = self._count - 1
    error(bad_reply('backend'), 2)
  end
  if spec.desktop and type(backend.desktop) ~= 'table' then
    pcall(backend.release, backend)
    self._count = self._count - 1
    error(errors.sandbox('failed', 'the provider returned a sandbox without a desktop'), 2)
  end
  if self._closed then
    pcall(backend.release, backend)
    self._count = self._count - 1
    error(errors.sandbox('closed', 'the pool was closed'), 2)
  end
  if held and held.archive then
    -- the snapshot's files, before the sandbox is anyone's; a failure ends it and frees its slot
    local timeout = self.call_timeout_ms
    local restored, err = pcall(snapshots.restore, function(name, ...)
      local args, n = { ... }, select('#', ...)
      return with_deadline(2 * timeout, function() return backend[name](backend, check.unpack(args, 1, n)) end)
    end, held.archive, { timeout_ms = timeout, binary = backend.binary_streams == true })
    if not restored or self._closed then
      pcall(backend.release, backend)
      self._count = self._count - 1
      if restored then error(errors.sandbox('closed', 'the pool was closed'), 2) end
      err = provider_error(err)
      if errors.is(err, 'SANDBOX_ERROR') and (err.reason == 'gone' or err.reason == 'unavailable') then
        err = errors.sandbox('failed', 'the new sandbox ended while the snapshot was unpacked in it (do its files '
          .. 'fit its memory?)')
      end
      error(err, 2)
    end
  end
  local sandbox = sandbox_object.new({
    id = type(backend.id) == 'string' and backend.id or ('sandbox-' .. tostring(started)),
    features = features,
    _pool = self,
    _backend = backend,
    _workdir = type(provider.workdir) == 'string' and provider.workdir or '/workspace',
    _ports = ports,
    _expires_at = started + options.lifetime_ms,
    _released = false,
    _events = events,
    _started = {},   -- handles of started processes still running
  })
  holder.id = sandbox.id
  for _, e in ipairs(events) do e.sandbox = sandbox.id end
  if features.desktop and type(backend.desktop) == 'table' then sandbox.desktop = new_desktop(sandbox) end
  self._alive[sandbox] = true
  self:_arm(sandbox, options.lifetime_ms)
  return sandbox
end

-- Ends the sandbox from the pool's side at its lifetime (the provider ends it too, on its own).
function Pool:_arm(sandbox, ms)
  -- unref: a sandbox alone does not keep a script running
  sandbox._timer = task.after(ms, function()
    sandbox._timer = nil
    if not sandbox._released then task.spawn(function() self:_expire(sandbox) end) end
  end, true)
end

function Pool._expire(_, sandbox)
  if sandbox._released then return end
  sandbox:release()
end

function Pool._stop_timer(_, sandbox)
  if sandbox._timer then
    sandbox._timer.cancel()
    sandbox._timer = nil
  end
end

-- The provider has released the sandbox: its slot is free.
function Pool:_free(sandbox)
  if self._alive[sandbox] then
    self._alive[sandbox] = nil
    self._count = self._count - 1
    -- a slot is free: the provider's warm sandboxes may take it again
    if self._warm then self.provider:warm_fill(self._warm) end
  end
end

--- How many sandboxes are alive, being created, or being released (until the provider's release
-- has returned). The provider's warm sandboxes are not in it, but take slots too: this count and
-- theirs (`provider:warm_held()`) together stay within max_sandboxes.
function Pool:count()
  return self._count
end

--- Releases every sandbox still alive, and the provider's warm sandboxes held for this pool (those
-- being started too), and refuses new ones.
function Pool:close()
  self._closed = true
  for snap in pairs(self._snapshots) do self:_release_snapshot(snap) end
  local list = {}
  for sb in pairs(self._alive) do list[#list + 1] = sb end
  local tasks = {}
  if self._warm then
    local provider, budget = self.provider, self._warm
    tasks[#tasks + 1] = task.spawn(function() provider:warm_detach(budget) end)
  end
  for _, sb in ipairs(list) do tasks[#tasks + 1] = task.spawn(function() sb:release() end) end
  for _, t in ipairs(tasks) do pcall(t.wait, t) end
end

return M
