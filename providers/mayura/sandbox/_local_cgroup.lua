--- mayura.sandbox._local_cgroup: the cgroups of a local sandbox (mayura.sandbox.local), run as root.
--
-- The provider looks once at which cgroup version and controllers there are (mode, parts), plans
-- each sandbox's directories and limits (plan: memory, pids, cpus, on v1 a freezer to kill every
-- process at once), and hands them to mayura-launch (launcher/cgroup.c), which makes them, joins
-- them, kills what is left in them at the end and removes them. Private to the local provider.
local core = require('mayura.core')
local host = require('mayura.sandbox._host')

local M = {}

local MIB = 1048576
local await_cb, exists, read_plain, write_plain = host.await, host.exists, host.read_plain, host.write_plain

--- Which cgroup version can be used here, as root: 'v2', 'v1' or nil.
function M.mode()
  if host.uid() ~= 0 then return nil end
  if exists('/sys/fs/cgroup/cgroup.controllers') then return 'v2' end
  if exists('/sys/fs/cgroup/memory/memory.limit_in_bytes') and exists('/sys/fs/cgroup/pids/cgroup.procs') then
    return 'v1'
  end
  return nil
end

--- Removes the cgroup directories `dirs` (a sandbox's that never started: its launcher removes
-- them otherwise).
function M.remove(dirs)
  for i = #dirs, 1, -1 do os.remove(dirs[i]) end
end

-- The sandbox's cgroups, planned: the directories (whose cgroup.procs the launcher joins, the memory
-- one first), how the launcher kills what is in them (`{ freezer = dir }` on v1, `{ v2 = dir }`),
-- and their settings, each `{ path, value, optional }`. Which controllers there are is the
-- provider's, looked at once (M.parts).
function M.plan(parts, id, limits)
  local dirs, kill, set = {}, {}, {}
  local function dir(path) dirs[#dirs + 1] = path return path end
  local function put(path, value, optional) set[#set + 1] = { path, value, optional or false } end
  local bytes = tostring(limits.memory_mib * MIB)
  local quota = math.floor(limits.cpus * 100000 + 0.5)
  if parts.mode == 'v1' then
    local mem = dir('/sys/fs/cgroup/memory/mayura/' .. id)
    put(mem .. '/memory.limit_in_bytes', bytes)
    put(mem .. '/memory.memsw.limit_in_bytes', bytes, true)
    put(mem .. '/memory.swappiness', '0', true)
    local pids = dir('/sys/fs/cgroup/pids/mayura/' .. id)
    put(pids .. '/pids.max', tostring(limits.pids))
    if parts.cpu then
      local cpu = dir('/sys/fs/cgroup/cpu/mayura/' .. id)
      put(cpu .. '/cpu.cfs_period_us', '100000')
      put(cpu .. '/cpu.cfs_quota_us', tostring(quota))
    end
    -- what the launcher freezes to kill every process in it at once (a fork bomb too)
    if parts.freezer then kill.freezer = dir('/sys/fs/cgroup/freezer/mayura/' .. id) end
  else
    local cg = dir('/sys/fs/cgroup/mayura/' .. id)
    put(cg .. '/memory.max', bytes)
    put(cg .. '/memory.swap.max', '0', true)
    put(cg .. '/pids.max', tostring(limits.pids))
    put(cg .. '/cpu.max', quota .. ' 100000', true)
    kill.v2 = cg
  end
  return dirs, kill, set
end

-- What the provider's cgroups are made of, looked at once: `{ mode, cpu, freezer }`, or nil
-- without cgroups. On v2 the parent (/sys/fs/cgroup/mayura) and its controllers are set up here.
function M.parts(mode)
  if not mode then return nil end
  if mode == 'v2' then
    write_plain('/sys/fs/cgroup/cgroup.subtree_control', '+memory +pids +cpu')
    await_cb(function(cb) core.fs.mkdir('/sys/fs/cgroup/mayura', nil, cb) end)
    write_plain('/sys/fs/cgroup/mayura/cgroup.subtree_control', '+memory +pids +cpu')
  end
  return {
    mode = mode,
    cpu = mode == 'v1' and exists('/sys/fs/cgroup/cpu/cpu.cfs_quota_us'),
    freezer = mode == 'v1' and exists('/sys/fs/cgroup/freezer/cgroup.procs'),
  }
end

-- The settings as the launcher reads them (MAYURA_CG_SET): `PATH VALUE` a line, `?` before an
-- optional one.
function M.set_text(set)
  local lines = {}
  for i, s in ipairs(set) do lines[i] = (s[3] and '?' or '') .. s[1] .. ' ' .. s[2] end
  return table.concat(lines, '\n')
end

-- How many times the sandbox's memory cgroup has killed a process for memory.
function M.oom_kills(mode, dirs)
  if mode == 'v1' then
    local s = read_plain(dirs[1] .. '/memory.oom_control') or ''
    return tonumber(s:match('oom_kill (%d+)')) or 0
  elseif mode == 'v2' then
    local s = read_plain(dirs[1] .. '/memory.events') or ''
    return tonumber(s:match('oom_kill (%d+)')) or 0
  end
  return 0
end

return M
