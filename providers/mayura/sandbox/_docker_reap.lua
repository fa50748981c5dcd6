--- mayura.sandbox._docker_reap: the sweep of what Docker sandboxes left behind.
--
-- A container carries its end in a label (mayura.expires, ms since the epoch); `reap` removes our
-- containers (label mayura.provider) whose time is over, with their socket directories: what a
-- host killed with SIGKILL, or an agent that never ended its container, left. It runs at every
-- construction of a provider (`force`) and at creates (at most every REAP_EVERY_MS per daemon);
-- a forced one also removes the snapshots' images of host processes that are gone. Private to the
-- Docker provider.
local core = require('mayura.core')
local task = require('mayura._task')
local dirs = require('mayura.sandbox._docker_dirs')
local host_util = require('mayura.sandbox._host')

local M = {}

--- The host removes a container this long after its lifetime (its own timer, and this sweep).
M.LIFETIME_GRACE_MS = 2000
local REAP_EVERY_MS = 30000                -- creates look for expired containers at most this often

local reaped_at = {}        -- daemon host -> when a reap last started (hrtime ms)

--- Removes our containers whose lifetime (label mayura.expires) is over, and their socket directories
-- under `base`: what a host killed with SIGKILL, or an agent that never ended its container, left.
-- Runs as a task of its own; failures are left to the next reap.
function M.reap(engine, host, base, owner, force)
  local now = core.hrtime_ms()
  if not force and reaped_at[host] and now - reaped_at[host] < REAP_EVERY_MS then return nil end
  reaped_at[host] = now
  return task.spawn(function()
    pcall(function()
      local now_ms = core.now_ms()
      local gone = {}
      for _, c in ipairs(engine:list_ours()) do
        if c.expires_ms and c.expires_ms + M.LIFETIME_GRACE_MS < now_ms and pcall(engine.remove, engine, c.id)
          and type(c.sandbox) == 'string' then
          gone[c.sandbox] = true
        end
      end
      -- only in a base directory that is ours and that no other user can swap
      if next(gone) and pcall(dirs.prepare_base, base, owner) then dirs.remove_dirs_of(base, gone) end
    end)
    -- the snapshots' images of host processes that are gone (this machine's: the daemon is local)
    if force then
      pcall(function()
        for _, im in ipairs(engine:list_snapshot_images()) do
          -- a mark of another pid namespace names a process this host cannot see
          if (im.pidns == nil or im.pidns == host_util.pid_namespace()) and not host_util.mark_alive(im.owner) then
            pcall(engine.remove_image, engine, im.ref)
          end
        end
      end)
    end
  end)
end

return M
