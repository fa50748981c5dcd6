--- mayura.sandbox._docker_engine: the two ways the Docker provider (mayura.sandbox.docker) talks
-- to the daemon, and how their failures are told.
--
-- `engine = 'cli'` (the default) runs the docker CLI for the container's life
-- (image inspect, run, inspect, rm, ps, network inspect/create; for snapshots create, cp,
-- commit, image ls/rm); `engine = 'api'` speaks the Engine API over its unix socket through
-- libcurl (images/{name}/json, containers/create, start, json, wait, DELETE, containers/json,
-- networks; for snapshots containers/{id}/archive, commit, images/json and DELETE). Only local
-- daemons: a tcp:// or ssh:// host is refused, because the agent and its socket directory are
-- bind-mounted from this machine.
--
-- Both engines take a container description (`c`: name, image, user, workdir, network, tmpfs,
-- mounts, limits, labels, ports, entrypoint and cmd, made by the provider) and offer the same
-- calls: image_env, run_container, runtimes, inspect, remove, list_ours, network and
-- create_network; and for snapshots kept as images (never pushed): snapshot_image (a container
-- made, not started, a tar put into its file system, committed as an image with the labels below,
-- the container removed; it returns the image's id, so that nothing uses a tag another user of the
-- daemon could move), remove_image and list_snapshot_images (only the images named in our
-- repository: one built on a snapshot's image inherits its label, and is not ours). The daemon's own words never
-- reach a caller's message: a failure is mapped to a reason (`docker could not <what> (<reason>)`),
-- its text kept as `cause` at most. Private to the Docker provider.
--
-- Each engine is a file of its own (mayura.sandbox._docker_cli, mayura.sandbox._docker_api); this one
-- holds what they share (the labels, the failures' errors, a start's retries), the daemon's
-- socket, and `new`, which makes one.
local core = require('mayura.core')
local errors = require('mayura.errors')
local exists = require('mayura.sandbox._host').exists

local M = {}

M.ENGINE_TIMEOUT_MS = 60000            -- one docker CLI call or Engine API request
--- The labels of our containers: the sandbox's id, the provider, the end of its lifetime (ms since
-- the epoch).
M.ID_LABEL, M.PROVIDER_LABEL, M.EXPIRES_LABEL = 'mayura.sandbox', 'mayura.provider', 'mayura.expires'
--- The label of a snapshot's image: the host process that made it (`PID-START`, its start time in
-- /proc/PID/stat), so that a provider can tell the images a killed host left; the pid namespace that
-- PID is of (a host in a container of its own, on the same daemon, has its own). Their repository.
M.SNAPSHOT_LABEL, M.SNAPSHOT_NS_LABEL, M.SNAPSHOT_REPO = 'mayura.snapshot.owner', 'mayura.snapshot.pidns',
  'mayura-snapshot'
-- the entrypoint of the container an image is committed from (never started)
M.NO_ENTRYPOINT = '/.mayura-none'

-- {======================================================
-- Mapping docker failures (their text never reaches the caller)
-- =======================================================

--- The coded error of a failed docker call about `what`, for a mapped `reason`.
function M.error(reason, what)
  if reason == 'runtime' then
    -- marked, so that a create can try once more without what the runtime may refuse
    local e = errors.sandbox('failed', 'docker could not ' .. what .. ' (the container runtime refused it)')
    e.runtime = true
    return e
  end
  return errors.sandbox(reason, 'docker could not ' .. what .. ' (' .. reason .. ')')
end

-- A start refused for a passing reason is tried again: START_TRIES in all, a longer pause each time
-- (`M.start_pause(tries)`: 250 ms more each, at most a second), while the create's time allows
-- (`c.start_by`, on the hrtime clock). A runtime under heavy load can lose several starts in a row.
local START_TRIES, START_PAUSE_MS, MAX_START_PAUSE_MS = 6, 250, 1000

function M.start_pause(tries)
  return math.min(START_PAUSE_MS * tries, MAX_START_PAUSE_MS)
end

-- runc's "can't get final child's PID from pipe" is how a refused OOM score ends here, and, without
-- a score to refuse, how a runtime under load loses its child: a passing failure then.
function M.runc_lost_child(c, low_reason)
  return not c.oom_score_adj and low_reason:find("final child's pid", 1, true) ~= nil
end

function M.may_retry(c, tries)
  return tries < START_TRIES and (not c.start_by or core.hrtime_ms() + M.start_pause(tries) < c.start_by)
end

--- INVALID_CONFIG for an image that is not on this machine.
function M.no_image(image)
  return errors.new('INVALID_CONFIG', 'the image ' .. image .. ' is not on this machine (images are never pulled)')
end

-- }======================================================

-- The local daemon's socket path from a host string; raises INVALID_CONFIG for anything else.
function M.socket_of(host)
  if type(host) ~= 'string' or host == '' then errors.raise('INVALID_CONFIG', 'host must be a string', nil, 0) end
  local path = host:match('^unix://(/.+)$')
  if not path then
    if host:match('^%a[%w+.-]*://') then
      errors.raise('INVALID_CONFIG', 'host must be a local daemon (unix:///path/to/docker.sock); remote hosts ' ..
        '(tcp://, ssh://, ...) are refused', nil, 0)
    end
    errors.raise('INVALID_CONFIG', 'host must be unix:///path/to/docker.sock', nil, 0)
  end
  if path:find('[%z\n]') or #path > 107 then
    errors.raise('INVALID_CONFIG', 'host is not a usable socket path', nil, 0)
  end
  return path
end

--- The daemon to use when the options name none: DOCKER_HOST, else the usual sockets.
function M.default_host()
  local env = os.getenv('DOCKER_HOST')
  if env and env ~= '' then return env end
  if exists('/var/run/docker.sock') then return 'unix:///var/run/docker.sock' end
  local rt = os.getenv('XDG_RUNTIME_DIR')
  if rt and rt ~= '' and exists(rt .. '/docker.sock') then return 'unix://' .. rt .. '/docker.sock' end
  return 'unix:///var/run/docker.sock'
end

--- The engine `name` ('cli': `docker` is the CLI's path, `host` the daemon; 'api': `socket` the
-- daemon's socket path).
function M.new(name, docker, host, socket)
  -- required here, not above: each engine's file requires this one for what they share
  if name == 'cli' then return require('mayura.sandbox._docker_cli').new(docker, host) end
  return require('mayura.sandbox._docker_api').new(socket)
end

return M
