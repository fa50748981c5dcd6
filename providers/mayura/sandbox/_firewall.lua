--- mayura.sandbox._firewall: the host's rules around sandboxes with network 'all' (local and Docker).
--
-- A sandbox with 'all' reaches the internet and nothing of the host: no address of the host (those
-- it gains after the sandbox started too: the rules ask the kernel whether a destination is the
-- host's, or refuse everything that comes in from a sandbox's link, and never list the host's
-- addresses), no other sandbox or container, and nothing in the IANA special-purpose ranges
-- (SPECIAL4: private, loopback, link-local with the cloud metadata address, shared, test,
-- multicast, reserved, broadcast). Neither provider carries IPv6 for 'all', so every IPv6 packet
-- of a sandbox is refused. DNS (port 53 alone) to the host's resolvers (its /etc/resolv.conf) is the
-- one exception: the local stack and Docker's embedded resolver relay a sandbox's names there.
--
-- The rules are root's, installed by the provider at a create with 'all' (again when 30 s have
-- passed), idempotently and atomically, and named as mayura's:
--   * local: the nft table `inet mayura_all`, whose output chain holds the sockets of the user-mode
--     stacks (slirp4netns, run with the group STACK_GID alone) to the above; each sandbox's own
--     namespace has its firewall too (_local_net.lua);
--   * Docker: the chains MAYURA-ALL-IN (hooked first in INPUT: nothing from the bridge of 'all'
--     reaches the host but answers) and MAYURA-ALL-FWD (hooked first in DOCKER-USER, Docker's hook
--     for FORWARD: nothing from that bridge to SPECIAL4, to docker0 or to another bridge of Docker)
--     of iptables' filter table, and the same two in ip6tables refusing all; only packets that come
--     in on mayura's bridge match, so other users of the daemon are left as they were.
local process = require('mayura.process')
local host = require('mayura.sandbox._host')

local M = {}

--- The gid the local stacks run with: the host table matches their sockets by it.
M.STACK_GID = 1199999

--- IPv4 destinations no sandbox with 'all' reaches: the IANA IPv4 special-purpose address registry
-- (every entry, "this network" and the globally reachable AS112 and AMT ones too), multicast, and
-- the reserved 240.0.0.0/4 with the limited broadcast.
M.SPECIAL4 = {
  '0.0.0.0/8', '10.0.0.0/8', '100.64.0.0/10', '127.0.0.0/8', '169.254.0.0/16', '172.16.0.0/12',
  '192.0.0.0/24', '192.0.2.0/24', '192.31.196.0/24', '192.52.193.0/24', '192.88.99.0/24',
  '192.168.0.0/16', '192.175.48.0/24', '198.18.0.0/15', '198.51.100.0/24', '203.0.113.0/24',
  '224.0.0.0/4', '240.0.0.0/4',
}

local CHECK_MS = 30000      -- how long installed rules are taken to be there
local RUN = { timeout_ms = 20000, max_output_bytes = 65536, env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' } }

--- The IPv4 nameservers of the host's resolver configuration (`text`, else /etc/resolv.conf).
function M.resolvers(text)
  text = text or host.read_plain('/etc/resolv.conf') or ''
  local out, seen = {}, {}
  for ip in ('\n' .. text):gmatch('\n[ \t]*nameserver[ \t]+(%d+%.%d+%.%d+%.%d+)') do
    if not seen[ip] then
      seen[ip] = true
      out[#out + 1] = ip
    end
  end
  return out
end

local function find(name)
  return host.find_in_path(name) or host.find_in_path('/usr/sbin/' .. name) or host.find_in_path('/sbin/' .. name)
end

local function run(argv, stdin)
  local opts = { stdin = stdin }
  for k, v in pairs(RUN) do opts[k] = v end
  local ok, res = pcall(process.run, argv, opts)
  if not ok then return false, tostring(res) end
  if res.exit_code ~= 0 then return false, (res.stderr or ''):sub(1, 300) end
  return true, res.stdout
end

-- {======================================================
-- Local: the stacks' sockets
-- =======================================================

--- The nft text of the local stacks' table (replacing whatever of it is there, in one transaction).
function M.stack_rules(resolvers)
  local lines = {
    'table inet mayura_all',
    'delete table inet mayura_all',
    'table inet mayura_all {',
    '  comment "mayura: what the network stacks of local sandboxes with network all may reach"',
    '  set special4 {',
    '    type ipv4_addr; flags interval; auto-merge;',
    '    elements = { ' .. table.concat(M.SPECIAL4, ', ') .. ' }',
    '  }',
    '  set resolvers4 {',
    '    type ipv4_addr;',
  }
  if #resolvers > 0 then lines[#lines + 1] = '    elements = { ' .. table.concat(resolvers, ', ') .. ' }' end
  for _, l in ipairs({
    '  }',
    '  chain output {',
    '    type filter hook output priority filter; policy accept;',
    '    meta skgid ' .. M.STACK_GID .. ' jump stack',
    '  }',
    '  chain stack {',
    '    ct state established,related accept',
    '    ip daddr @resolvers4 udp dport 53 accept',
    '    ip daddr @resolvers4 tcp dport 53 accept',
    '    meta nfproto ipv6 reject with icmpx type admin-prohibited',
    '    fib daddr type { local, broadcast, multicast, anycast } reject with icmpx type admin-prohibited',
    '    ip daddr @special4 reject with icmpx type admin-prohibited',
    '  }',
    '}',
    '',
  }) do lines[#lines + 1] = l end
  return table.concat(lines, '\n')
end

local stack_until = 0

--- Installs (at most every 30 s) the local stacks' table with the program `nft`; raises a message.
function M.ensure_stack(nft)
  local now = require('mayura.core').hrtime_ms()
  if stack_until > now then return end
  local ok, err = run({ nft, '-f', '-' }, M.stack_rules(M.resolvers()))
  if not ok then error('the host firewall of the network stacks did not load: ' .. err, 0) end
  stack_until = now + CHECK_MS
end

-- }======================================================

-- {======================================================
-- Docker: the bridge of 'all'
-- =======================================================

--- The programs the Docker rules need, or nil when one is missing.
function M.docker_tools()
  local t = {
    iptables = find('iptables'), iptables_restore = find('iptables-restore'),
    ip6tables = find('ip6tables'), ip6tables_restore = find('ip6tables-restore'),
  }
  if not (t.iptables and t.iptables_restore and t.ip6tables and t.ip6tables_restore) then return nil end
  return t
end

local COMMENT = '-m comment --comment "mayura: network all"'

--- The iptables-restore texts (IPv4, IPv6) of the chains for the bridge interface `bridge`.
function M.docker_rules(bridge, resolvers)
  local i = '-i ' .. bridge .. ' '
  local v4 = {
    '*filter', ':MAYURA-ALL-IN - [0:0]', ':MAYURA-ALL-FWD - [0:0]',
    '-A MAYURA-ALL-IN ' .. i .. '-m conntrack --ctstate ESTABLISHED,RELATED -j RETURN ' .. COMMENT,
  }
  for _, ip in ipairs(resolvers) do
    for _, proto in ipairs({ 'udp', 'tcp' }) do
      for _, chain in ipairs({ 'MAYURA-ALL-IN', 'MAYURA-ALL-FWD' }) do
        v4[#v4 + 1] = '-A ' .. chain .. ' ' .. i .. '-d ' .. ip .. '/32 -p ' .. proto .. ' --dport 53 -j RETURN '
          .. COMMENT
      end
    end
  end
  v4[#v4 + 1] = '-A MAYURA-ALL-IN ' .. i .. '-j REJECT --reject-with icmp-admin-prohibited ' .. COMMENT
  v4[#v4 + 1] = '-A MAYURA-ALL-FWD ' .. i .. '-m conntrack --ctstate ESTABLISHED,RELATED -j RETURN ' .. COMMENT
  for _, out in ipairs({ 'docker0', 'br-+' }) do
    v4[#v4 + 1] = '-A MAYURA-ALL-FWD ' .. i .. '-o ' .. out .. ' -j REJECT --reject-with icmp-admin-prohibited '
      .. COMMENT
  end
  for _, net in ipairs(M.SPECIAL4) do
    v4[#v4 + 1] = '-A MAYURA-ALL-FWD ' .. i .. '-d ' .. net .. ' -j REJECT --reject-with icmp-admin-prohibited '
      .. COMMENT
  end
  v4[#v4 + 1] = 'COMMIT'
  v4[#v4 + 1] = ''
  local v6 = {
    '*filter', ':MAYURA-ALL-IN - [0:0]', ':MAYURA-ALL-FWD - [0:0]',
    '-A MAYURA-ALL-IN ' .. i .. '-j REJECT --reject-with icmp6-adm-prohibited ' .. COMMENT,
    '-A MAYURA-ALL-FWD ' .. i .. '-j REJECT --reject-with icmp6-adm-prohibited ' .. COMMENT,
    'COMMIT', '',
  }
  return table.concat(v4, '\n'), table.concat(v6, '\n')
end

-- Makes sure `chain` of the filter table jumps first to `target` (added when no such jump is there).
local function hook(tables, chain, target)
  if run({ tables, '-w', '-t', 'filter', '-C', chain, '-j', target, '-m', 'comment', '--comment',
    'mayura: network all' }) then return true end
  return run({ tables, '-w', '-t', 'filter', '-I', chain, '1', '-j', target, '-m', 'comment', '--comment',
    'mayura: network all' })
end

--- Installs the chains for the bridge interface `bridge` and hooks them (`tools` from docker_tools);
-- raises a message when it cannot.
function M.ensure_docker(tools, bridge)
  if not bridge:match('^[%w._-]+$') or #bridge > 15 then error('the bridge\'s name is not usable: ' .. bridge, 0) end
  local v4, v6 = M.docker_rules(bridge, M.resolvers())
  local ok, err = run({ tools.iptables_restore, '-w', '--noflush' }, v4)
  if ok then ok, err = run({ tools.ip6tables_restore, '-w', '--noflush' }, v6) end
  -- DOCKER-USER is Docker's hook for FORWARD; without it (a daemon that leaves iptables alone), FORWARD
  local fwd4 = run({ tools.iptables, '-w', '-t', 'filter', '-S', 'DOCKER-USER' }) and 'DOCKER-USER' or 'FORWARD'
  for _, h in ipairs({ { tools.iptables, 'INPUT', 'MAYURA-ALL-IN' }, { tools.iptables, fwd4, 'MAYURA-ALL-FWD' },
    { tools.ip6tables, 'INPUT', 'MAYURA-ALL-IN' }, { tools.ip6tables, 'FORWARD', 'MAYURA-ALL-FWD' } }) do
    if not ok then break end
    ok, err = hook(h[1], h[2], h[3])
  end
  if not ok then error('the host firewall of network all did not load: ' .. tostring(err), 0) end
end

-- }======================================================

return M
