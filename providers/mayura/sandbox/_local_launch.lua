--- mayura.sandbox._local_launch: what the local provider hands mayura-launch (launcher/) for one
-- sandbox: bubblewrap's command line (the namespaces, the root: the host's parts, an image, or the
-- tree the launcher builds; /proc, /dev, the tmpfs, the agent's copy) and the launcher's
-- environment (the lifetime, the cgroups and their settings, the /etc texts, the sandbox's host
-- uid). Nothing here runs anything. Private to the local provider.
local root_fs = require('mayura.sandbox._local_root')
local cgroup = require('mayura.sandbox._local_cgroup')
local network = require('mayura.sandbox._local_net')

local M = {}

local MIB = 1048576
local SANDBOX_UID = 1000
local WORKDIR, AGENT_PATH, STAGE = root_fs.WORKDIR, root_fs.AGENT_PATH, root_fs.STAGE

-- How long past its lifetime the launcher gives the agent to end the sandbox by itself.
local GRACE_MS = 1000

--- bubblewrap's arguments; `built`: the table of a tree mayura-launch builds (built_table).
function M.bwrap_argv(p, spec, built)
  local a = { p.bwrap,
    '--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try',
    '--uid', tostring(SANDBOX_UID), '--gid', tostring(SANDBOX_UID),
    '--hostname', 'sandbox',
    '--new-session', '--as-pid-1', '--disable-userns', '--clearenv', '--cap-drop', 'ALL',
    '--die-with-parent',
  }
  local function add(...) for _, x in ipairs({ ... }) do a[#a + 1] = x end end
  -- a network namespace of its own, always; with 'all' the host connects it (connect_network)
  -- before the agent gets its setup
  add('--unshare-net')
  if network.online(spec) then add('--info-fd', tostring(network.INFO_FD)) end
  local image = spec.image or p.image
  local staged = p.staged    -- the launcher mounts the file systems under STAGE
  if built then
    -- read-only and locked already: bubblewrap adds /proc, in the sandbox's pid namespace
    add('--dev-bind', STAGE .. '/root', '/', '--proc', '/proc', '--chdir', '/')
    add(AGENT_PATH, '--fd', '3', '--lifetime-ms', tostring(spec.lifetime_ms), '--workdir', WORKDIR)
    return a
  end
  if image then
    add('--ro-bind', image, '/')
  else
    -- as root the root is the launcher's tmpfs (else bubblewrap's own), read-only once made
    if staged then add('--bind', STAGE .. '/root', '/') end
    -- the /etc texts come on descriptors 5..9
    for _, st in ipairs(root_fs.host_steps(p)) do
      if st[1] == 'dir' then add('--dir', st[2])
      elseif st[1] == 'file' then add('--file', tostring(4 + st[2]), st[3])
      else add(st[1] == 'bind' and '--ro-bind' or '--symlink', st[2], st[3]) end
    end
  end
  -- with 'all' and an image, the stack's resolver over the image's own resolv.conf file (without an
  -- image it is one of the /etc copies)
  if spec.network == 'all' and image and root_fs.lstat_type(image .. '/etc/resolv.conf') == 'file' then
    add('--ro-bind-data', '5', '/etc/resolv.conf')
  end
  add('--proc', '/proc')
  if staged and not image then
    -- bubblewrap's --dev would be a tmpfs naming the host uid
    add('--dir', '/dev')
    for _, d in ipairs(root_fs.DEVICES) do add('--dev-bind', '/dev/' .. d, '/dev/' .. d) end
    for _, l in ipairs(root_fs.DEV_LINKS) do add('--symlink', l[1], '/dev/' .. l[2]) end
    add('--dev-bind', STAGE .. '/pts', '/dev/pts')
  else
    add('--dev', '/dev')
  end
  if staged then
    add('--bind', STAGE .. '/s', '/dev/shm', '--bind', STAGE .. '/t', '/tmp', '--bind', STAGE .. '/w', WORKDIR)
  else
    -- /dev/shm is as small as /tmp: a tmpfs without a cap fills the sandbox's memory instead
    add('--size', tostring(p.tmp_mib * MIB), '--perms', '1777', '--tmpfs', '/dev/shm')
    add('--size', tostring(p.tmp_mib * MIB), '--perms', '1777', '--tmpfs', '/tmp')
    add('--size', tostring(p.workspace_mib * MIB), '--perms', '0755', '--tmpfs', WORKDIR)
  end
  -- the agent's bytes come on fd 0: a copy, never a bind of a host path
  if image then
    add('--perms', '0555', '--ro-bind-data', '0', AGENT_PATH)
    add('--remount-ro', '/dev')
  else
    add('--dir', '/.mayura', '--perms', '0555', '--file', '0', AGENT_PATH)
    -- the root and /dev (bubblewrap's tmpfs have no cap) hold no writable place of their own
    if not staged then add('--remount-ro', '/dev') end
    add('--remount-ro', '/')
  end
  add('--chdir', '/')
  add(AGENT_PATH, '--fd', '3', '--lifetime-ms', tostring(spec.lifetime_ms), '--workdir', WORKDIR)
  return a
end

--- The launcher's environment for one sandbox (`built`: as for bwrap_argv).
function M.launcher_env(p, spec, cg_dirs, cg_kill, host_uid, cg_set, built)
  local life = spec.lifetime_ms + GRACE_MS
  local env = {
    PATH = '/usr/sbin:/usr/bin:/sbin:/bin',
    MAYURA_LIFE = ('%d.%03d'):format(math.floor(life / 1000), life % 1000),
    MAYURA_CG = table.concat(cg_dirs, ' '),
    MAYURA_FREEZER = cg_kill.freezer or '',
    MAYURA_CGKILL = cg_kill.v2 or '',
  }
  -- mayura-launch makes the cgroups itself, before the sandbox's first process joins them
  if cg_set then env.MAYURA_CG_SET = cgroup.set_text(cg_set) end
  if not (spec.image or p.image) then
    -- on descriptors for bubblewrap's --file, unless the launcher writes them into the root
    if not built then env.MAYURA_ETC_FDS = '1' end
    -- the launcher ends each text with a newline of its own
    for i, name in ipairs(root_fs.ETC_NAMES) do
      local text = root_fs.ETC[name]
      if name == 'resolv.conf' and spec.network == 'all' then text = network.RESOLV end
      env['MAYURA_ETC_' .. i] = (text:gsub('\n$', ''))
    end
  elseif spec.network == 'all' then
    -- for bubblewrap's --ro-bind-data, or the launcher's `file` step (image_tree)
    env[built and 'MAYURA_ETC_4' or 'MAYURA_RESOLV'] = (network.RESOLV:gsub('\n$', ''))
  end
  if network.online(spec) then env.MAYURA_INFO = '1' end
  if p.root then env.MAYURA_UID = tostring(host_uid) end
  -- MAYURA_MOUNT: the descriptor of the mount table (start)
  return env
end

return M
