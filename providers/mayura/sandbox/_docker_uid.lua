--- mayura.sandbox._docker_uid: a uid and gid of its own for each Docker sandbox.
--
-- By default each sandbox runs as a uid (also its gid) from 1300000 up that no host account, group
-- or /etc/subuid / subgid range has and no other sandbox of this process uses, so nothing on the
-- host shares its uid's signals, files or per-uid kernel limits. Private to the Docker provider.
local errors = require('mayura.errors')
local process = require('mayura.process')
local host_util = require('mayura.sandbox._host')

local M = {}

local UID_BASE, UID_SPAN = 1300000, 1048576  -- per-sandbox uids and gids: [base, base + span)
local read_plain, find_in_path, random_hex = host_util.read_plain, host_util.find_in_path, host_util.random_hex

local uids_in_use = {}      -- uid -> true, for the sandboxes of this process

-- The uid ranges of /etc/subuid or /etc/subgid: a user may run processes under those uids.
local function subid_ranges(path)
  local ranges = {}
  for line in (read_plain(path) or ''):gmatch('[^\n]+') do
    local first, count = line:match('^[^:]*:(%d+):(%d+)')
    if first then ranges[#ranges + 1] = { tonumber(first), tonumber(first) + tonumber(count) - 1 } end
  end
  return ranges
end

local function in_ranges(n, ranges)
  for _, r in ipairs(ranges) do
    if n >= r[1] and n <= r[2] then return true end
  end
  return false
end

-- Whether the host's files or name service know `id` as a user or a group.
local function host_knows(id)
  local text = tostring(id)
  for _, file in ipairs({ '/etc/passwd', '/etc/group' }) do
    for line in (read_plain(file) or ''):gmatch('[^\n]+') do
      if line:match('^[^:]*:[^:]*:(%d+):') == text then return true end
    end
  end
  local getent = find_in_path('getent')
  if not getent then return false end
  for _, db in ipairs({ 'passwd', 'group' }) do
    local ok, res = pcall(process.run, { getent, db, text }, { timeout_ms = 10000 })
    -- 2 is "not found"; anything else (found, or no answer) counts as known
    if not ok or res.exit_code ~= 2 then return true end
  end
  return false
end

-- A uid (also the gid) for one sandbox that no host account, group or subordinate range has and no
-- other sandbox of this process uses; raises `unavailable` when none is found.
local function pick_uid()
  local ranges = subid_ranges('/etc/subuid')
  for _, r in ipairs(subid_ranges('/etc/subgid')) do ranges[#ranges + 1] = r end
  for _ = 1, 16 do
    local n = UID_BASE + (tonumber(random_hex(4), 16) or 0) % UID_SPAN
    if not uids_in_use[n] and not in_ranges(n, ranges) and not host_knows(n) then
      uids_in_use[n] = true
      return n
    end
  end
  error(errors.sandbox('unavailable', 'no free uid for the sandbox'), 0)
end

-- Whether the agent binary knows `--peer-uid` (it then serves only the host's uid on its socket). Read
-- at each construction (a millisecond), plainly, so a provider can be made anywhere.
local function agent_takes_peer_uid(agent)
  return (read_plain(agent) or ''):find('--peer-uid', 1, true) ~= nil
end

--- Gives back a uid pick_uid handed out (its sandbox is gone, or never started).
function M.free(n)
  uids_in_use[n] = nil
end

M.pick, M.agent_takes_peer_uid = pick_uid, agent_takes_peer_uid

return M
