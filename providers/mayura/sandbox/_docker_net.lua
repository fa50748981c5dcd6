--- mayura.sandbox._docker_net: the network of a Docker sandbox (mayura.sandbox.docker).
--
-- No network (`--network none`) unless 'all' was allowed and asked for;
-- then the bridge network `mayura-isolated` (made on demand, labelled
-- ours, with inter-container traffic off: enable_icc=false), with the
-- sandbox's `ports` published on 127.0.0.1 only (`url(port)` gives
-- http://127.0.0.1:<host port>); as root the provider loads the host's
-- rules around that bridge (mayura.sandbox._firewall, iptables: chains
-- MAYURA-ALL-IN from INPUT and MAYURA-ALL-FWD from DOCKER-USER) so 'all'
-- reaches the internet and nothing of the host (no address of it, those
-- it gains later too), no other container, no loopback, link-local
-- (cloud metadata), multicast or IANA special-purpose range, and no
-- IPv6; Docker's embedded DNS (127.0.0.11) relays to the host's
-- resolvers, which take port 53 alone; run as another user (the docker
-- group) no rule is loaded: the bridge alone, `enforced.network` false.
-- One shared network rather than one per sandbox: a network costs about
-- 0.3 s to make and remove, and the daemon's address pools hold ~30 of
-- them; a bridge takes about 1,000 containers.
--
-- With a network allow-list (`{ allow = { ... } }`, offered when run as
-- root: `features.network` lists 'allowlist'), `--network none` too, and
-- an egress proxy of its own (mayura.sandbox._egress) listening on
-- 127.0.0.1:3128 inside the container's namespace (found from its PID 1
-- before the agent gets its setup), with HTTP_PROXY / HTTPS_PROXY set for
-- commands: the listed names on ports 80 and 443 are all it reaches; its
-- refusals are network events (`sandbox:events()`, the pool's
-- `on_event`); `ports` are forwarded by the proxy from 127.0.0.1.
-- Private to the Docker provider.
local errors = require('mayura.errors')
local egress = require('mayura.sandbox._egress')
local fw = require('mayura.sandbox._firewall')
local engines = require('mayura.sandbox._docker_engine')

local M = {}

--- The bridge of 'all' sandboxes: no traffic between its containers.
M.NETWORK = 'mayura-isolated'
local NETWORK = M.NETWORK
local NETWORK_LABEL = 'mayura.network'
local PROVIDER_LABEL = engines.PROVIDER_LABEL
local docker_error = engines.error

local NETWORK_OPTIONS = {
  ['com.docker.network.bridge.enable_icc'] = 'false',            -- no traffic between its containers
  ['com.docker.network.bridge.host_binding_ipv4'] = '127.0.0.1', -- ports published on loopback by default
}

local function network_is_ours(info)
  local labels = type(info.labels) == 'table' and info.labels or {}
  local options = type(info.options) == 'table' and info.options or {}
  return info.driver == 'bridge' and labels[NETWORK_LABEL] == 'isolated'
    and options['com.docker.network.bridge.enable_icc'] == 'false'
end

-- The name of the host interface of the bridge network `info`: the name it was given, else Docker's.
local function bridge_name(info)
  local options = type(info.options) == 'table' and info.options or {}
  local name = options['com.docker.network.bridge.name']
  if type(name) == 'string' and name ~= '' then return name end
  if type(info.id) ~= 'string' or not info.id:match('^%x+$') or #info.id < 12 then
    error(docker_error('failed', 'inspect a network (no id)'), 0)
  end
  return 'br-' .. info.id:sub(1, 12)
end

-- Makes sure the network of 'all' sandboxes is there, ours and isolating, creating it when missing;
-- and, with `firewall` (the programs, as root), that the host's rules around its bridge are loaded
-- (mayura.sandbox._firewall: nothing of the host, no other container, no special-purpose range).
local function ensure_network(engine, firewall)
  local info = engine:network(NETWORK)
  if not info then
    engine:create_network(NETWORK, { [PROVIDER_LABEL] = 'docker', [NETWORK_LABEL] = 'isolated' }, NETWORK_OPTIONS)
    -- made here, or by someone else at the same moment: either way, look at what is there
    info = engine:network(NETWORK)
    if not info then error(docker_error('failed', 'create a network'), 0) end
  end
  if not network_is_ours(info) then
    error(errors.sandbox('conflict', 'a Docker network named ' .. NETWORK .. ' exists that is not mayura\'s ' ..
      'isolated bridge (remove it)'), 0)
  end
  if firewall then
    local ok, err = pcall(fw.ensure_docker, firewall, bridge_name(info))
    if not ok then error(errors.sandbox('unavailable', tostring(err)), 0) end
  end
end

-- Removes our containers whose lifetime (label mayura.expires) is over, and their socket directories
-- under `base`: what a host killed with SIGKILL, or an agent that never ended its container, left.

--- Starts the egress proxy of an allow-listed container (`--network none`: its loopback alone) in its
-- network namespace, found from its PID 1 on this machine, and the forwards of `spec.ports`.
local function start_proxy(backend, eng, container, spec, resolve)
  local uv = require('luv')
  local function fail(what)
    error(errors.sandbox('unavailable', 'cannot connect the sandbox\'s network: ' .. what), 0)
  end
  local st = eng:inspect(container)
  if not st or not st.running or not st.pid or st.pid <= 1 then fail('the sandbox did not start') end
  local ns_fd = uv.fs_open('/proc/' .. math.floor(st.pid) .. '/ns/net', 'r', 0)
  if not ns_fd then fail('its namespace cannot be opened') end
  -- never the host's own namespace, whatever the daemon said
  local link = uv.fs_readlink('/proc/self/fd/' .. ns_fd)
  if not link or link == uv.fs_readlink('/proc/self/ns/net') then
    uv.fs_close(ns_fd)
    fail('not the sandbox\'s namespace')
  end
  -- still that container's PID 1 (not a pid reused since the inspect)
  local again = eng:inspect(container)
  if not again or again.pid ~= st.pid then
    uv.fs_close(ns_fd)
    fail('the sandbox ended')
  end
  backend.proxy = egress.start_sandbox(ns_fd, spec, resolve, backend.ports)
end

M.ensure, M.start_proxy = ensure_network, start_proxy

return M
