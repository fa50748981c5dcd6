--- mayura.sandbox.apple_container: sandboxes as Apple `container` VMs on this Mac
-- (https://github.com/apple/container; macOS 26, Apple silicon), through the `container` CLI
-- the way the Docker provider's cli engine uses `docker`, on command_sandbox_backend over
-- `container exec`.
--
--   local apple = require('mayura.sandbox.apple_container')
--   local provider = apple.apple_container_sandboxes({ image = 'docker.io/library/node:22-slim' })
--   local sandboxes = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 3600000 })
--
-- Options: `image` (an OCI image with sh and coreutils or BusyBox; default
-- docker.io/library/node:22-slim; a create's `image` names another), `executable` (the CLI:
-- `container`, found on PATH), `host_only_network` (the name of a network made with `container
-- network create --internal NAME`: network 'none' then uses it, as a host-only network, instead of
-- `--network none`, which gives the VM no interface at all), `user` (`-u`, default 1000:1000),
-- `max_lifetime_ms` (24 h), `cli_timeout_ms` (the longest one CLI call may take: 60 s), `warm`
-- (VMs started ahead for the pool, 0 to 64, none by default: a create with the pool's labels,
-- network 'none' and no image, cpus or memory takes one; mayura.sandbox._kit owns the lifecycle).
--
-- A create is `container run -d --rm --name mayura-<the create's tag> --network none|default --cap-drop ALL
-- --init -u USER --tmpfs /workspace [-c CPUS] [-m MEMORY] -l k=v... IMAGE sleep <lifetime s>`: the
-- VM's main process sleeps for the lifetime and `--rm` removes it when that ends (the CLI has no
-- TTL); the pool also deletes it (`container delete --force`) at its lifetime. Everything else is
-- one `container exec -i ID sh -s` at a time, the script on its standard input, so that neither
-- file contents nor environment values (which go with each command, not on the CLI's command
-- line) appear in a process list; command_sandbox_backend starts commands in the background,
-- polls them, moves files as base64 and kills a command's every process by a tag.
--
-- Failures: a failed CLI call is checked with `container inspect`: not found, or a state other
-- than running, is SANDBOX_ERROR `gone`; a CLI that cannot be run, or whose system service is not
-- started, is `unavailable`; a call past `cli_timeout_ms` is `timeout`; anything else `failed`. The
-- CLI's own text never becomes a message.
--
-- `features`: network { 'none', 'all' } ('all' is the default NAT network), no ports (published
-- ports are the host's, not per sandbox), stdin true (through a file), no desktop.
--
-- Tested on Linux only, with a fake `container` (spec/support/fake_container/container) that
-- follows the CLI's documented output and runs Docker containers; it has not run on a Mac.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local process = require('mayura.process')
local sandbox = require('mayura.sandbox')
local kit = require('mayura.sandbox._kit')

local M = {}

local MIB = 1048576
local DEFAULT_IMAGE = 'docker.io/library/node:22-slim'
local DEFAULT_MAX_LIFETIME_MS = 24 * 3600000
local CLI_TIMEOUT_MS = 60000

-- Runs the CLI; its failures to run become coded errors without its text.
local function cli(self, args, opts)
  local argv = { self.executable }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  opts = opts or {}
  local ok, r = pcall(process.run, argv, { stdin = opts.stdin, signal = opts.signal,
    timeout_ms = opts.timeout_ms or self.timeout_ms, max_output_bytes = opts.max_output_bytes or 4 * MIB })
  if not ok then
    if errors.is(r, 'CANCELLED') then error(r, 0) end
    error(errors.sandbox('unavailable', 'apple_container: the container CLI could not be run'), 0)
  end
  if r.timed_out then
    error(errors.sandbox('timeout', 'apple_container: the container CLI did not answer in time'), 0)
  end
  if r.exit_code ~= 0 and (r.stderr or ''):find('XPC', 1, true) then
    error(errors.sandbox('unavailable', 'apple_container: the container system service is not running'), 0)
  end
  return r
end

-- Raises gone when `container inspect` does not find the VM running.
local function check_alive(self, id)
  local r = cli(self, { 'inspect', id })
  if r.exit_code ~= 0 then error(errors.sandbox('gone', 'apple_container: the container is gone'), 0) end
  local ok, list = pcall(core.json.decode, r.stdout)
  local item = ok and type(list) == 'table' and list[1]
  local state = type(item) == 'table' and type(item.status) == 'table' and item.status.state
  if state ~= 'running' then error(errors.sandbox('gone', 'apple_container: the container is not running'), 0) end
end

local function transport(self, id, env)
  local t = { stdin = false, max_command_bytes = MIB, workdir = '/workspace', env = env }
  function t.run(_, command, o)
    local r = cli(self, { 'exec', '-i', id, 'sh', '-s' }, { stdin = command, signal = o.signal })
    if r.exit_code ~= 0 then check_alive(self, id) end
    if r.truncated then error(errors.sandbox('failed', 'apple_container: a command answered more than 4 MiB'), 0) end
    return { exit_code = r.exit_code or 128, stdout = r.stdout }
  end
  return t
end

local function word(v, what, pattern)
  return check.word(v, pattern, 'apple_container: ' .. what .. ' is not valid', 'INVALID_CONFIG', 0)
end

--- The provider: see the module's comment for the options.
function M.apple_container_sandboxes(options)
  local o = kit.options(options or {}, {
    { image = kit.word('^[%w][%w%._/:@%-]*$', 'an image reference', DEFAULT_IMAGE) },
    { executable = kit.word('^[%w%._/%-]+$', 'a path', 'container') },
    { host_only_network = kit.word('^[%w][%w%._%-]*$', 'a network name') },
    { user = kit.word('^[%w_][%w_%-]*:?[%w_%-]*$', 'a user or user:group', '1000:1000') },
    { max_lifetime_ms = kit.int(60000, nil, DEFAULT_MAX_LIFETIME_MS) },
    { cli_timeout_ms = kit.int(1000, nil, CLI_TIMEOUT_MS) },
    kit.WARM_OPTION,
  }, 'apple_container', 'apple_container_sandboxes takes an options table')
  local self = { executable = o.executable, timeout_ms = o.cli_timeout_ms }
  local function destroy(_, h) cli(self, { 'delete', '--force', h.id }) end

  return kit.provider({
    id = 'apple-container', label = 'apple_container', options = o, command = true,
    features = { stdin = true, ports = false, desktop = false, network = { 'none', 'all' } },
    workdir = '/workspace',

    -- the container's name carries the create's tag
    create = function(ctx)
      local spec = ctx.spec
      local net = spec.network == 'all' and 'default' or (o.host_only_network or 'none')
      local args = { 'run', '-d', '--rm', '--name', 'mayura-' .. ctx.tag, '--network', net, '--cap-drop', 'ALL',
        '--init', '-u', o.user, '--tmpfs', '/workspace' }
      if spec.cpus then
        args[#args + 1] = '-c'
        args[#args + 1] = tostring(math.ceil(spec.cpus))
      end
      if spec.memory_mib then
        args[#args + 1] = '-m'
        args[#args + 1] = math.ceil(spec.memory_mib) .. 'M'
      end
      local names = {}
      for k in pairs(spec.labels or {}) do names[#names + 1] = k end
      table.sort(names)
      for _, k in ipairs(names) do
        local v = spec.labels[k]
        if not k:match('^[%w][%w%._%-/]*$') or #k > 128 or v:find('[%c]') or #v > 256 then
          errors.raise('INVALID_INPUT', 'apple_container: labels must be plain names and short values', nil, 0)
        end
        args[#args + 1] = '-l'
        args[#args + 1] = k .. '=' .. v
      end
      args[#args + 1] = word(spec.image, 'image', '^[%w][%w%._/:@%-]*$') or o.image
      args[#args + 1] = 'sleep'
      args[#args + 1] = tostring(math.ceil(spec.lifetime_ms / 1000))
      return cli(self, args)
    end,

    accept = function(ctx, r)
      if r.exit_code ~= 0 or r.stdout:match('^%s*(%S+)') ~= 'mayura-' .. ctx.tag then
        error(ctx:bad_answer('a container that did not start'), 0)
      end
      return { id = 'mayura-' .. ctx.tag }
    end,

    -- a create that failed or timed out deletes the container by its name (none made is fine)
    find = function(_, tag) return { { id = 'mayura-' .. tag } } end,

    backend = function(ctx, h)
      local backend = sandbox.command_sandbox_backend('apple-container-' .. h.id, transport(self, h.id, ctx.spec.env),
        function() destroy(ctx, h) end)
      backend.container_id = h.id
      return backend
    end,

    destroy = destroy,
  })
end

M.sandboxes = M.apple_container_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
