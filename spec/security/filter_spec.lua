-- The syscall filter every command runs under, and the agent's socket seen from inside, on every
-- provider here. The hostile program (abuse.c `syscalls`) calls each class of system call the
-- agent's filter refuses with arguments that make it fail otherwise (bad pointers or descriptors,
-- or values read back first), so EPERM says the filter refused it; what ordinary work needs must
-- still work (fork, threads, sockets, netlink route, a shell, node). On Docker, code in the sandbox
-- connects to the agent's socket and tries hello, setup and exec: the agent serves only the host,
-- which went first, so nothing there can change what the host's later commands run with. Commands
-- start filtered also when code inside stopped or killed the agent's helper that starts them.
local providers = require('support.providers')
local common = require('security.common')

local sh = common.sh

-- Every probe of `abuse syscalls` that must be refused, with the errno it must get.
local DENIED = {
  'mount', 'umount2', 'pivot_root', 'chroot', 'fsopen', 'open_tree', 'move_mount', 'swapon', 'swapoff',
  'reboot', 'kexec_load', 'kexec_file_load', 'init_module', 'finit_module', 'delete_module', 'acct',
  'settimeofday', 'clock_settime', 'clock_adjtime', 'adjtimex', 'unshare', 'setns', 'clone_newuser',
  'clone_newns', 'clone_newnet', 'clone_newpid', 'keyctl', 'add_key', 'request_key', 'bpf',
  'perf_event_open', 'userfaultfd', 'open_by_handle_at', 'name_to_handle_at', 'lookup_dcookie', 'quotactl',
  'nfsservctl', 'iopl', 'ioperm', 'syslog', 'uselib', 'fanotify_init', 'mbind', 'move_pages',
  'migrate_pages', 'set_mempolicy', 'get_mempolicy', 'kcmp', 'pidfd_getfd', 'process_madvise',
  'sethostname', 'setdomainname', 'sysfs', 'personality', 'personality_high', 'io_uring_setup',
  'io_uring_enter', 'io_uring_register', 'socket_vsock', 'socket_vsock_high', 'socket_netlink_audit',
  'socket_netlink_uevent', 'setpriority_other', 'setpriority_group', 'sched_setaffinity_other',
  'sched_setparam_other', 'sched_setscheduler_other', 'sched_setattr_other', 'prlimit_other',
  'ioprio_set_other', 'ioprio_set_group', 'tiocsti', 'tiocsti_high', 'clear_subreaper', 'abi_i386', 'abi_x32',
}

local ALLOWED = {
  'personality_query', 'personality_linux', 'setpriority_self', 'sched_setaffinity_self', 'prlimit_self',
  'prlimit_read_other', 'ioprio_set_self', 'set_subreaper', 'socket_inet', 'socket_inet6', 'socket_unix',
  'socket_netlink_route', 'fork', 'thread', 'getpid',
}
-- What gVisor's kernel (not the filter) lacks: personality(2) and PR_SET_CHILD_SUBREAPER answer EINVAL
-- and ioprio_set EPERM; it has no 32-bit ABI at all (int 0x80 fails before any filter)
local GVISOR_LACKS = { personality_query = 'EINVAL', personality_linux = 'EINVAL', set_subreaper = 'EINVAL',
  ioprio_set_self = 'EPERM' }

-- Whether the command runs under a seccomp filter: the count of /proc/self/status, or, where the kernel
-- shows no count (gVisor's), its mode.
local function filtered(sb, kv)
  if kv.filters then return tonumber(kv.filters) >= 1 end
  return sb:exec({ 'grep', '-q', '^Seccomp:.*2', '/proc/self/status' }).exit_code == 0
end

for _, prov in ipairs(providers.list()) do
  describe('the syscall filter of commands (' .. prov.name .. ')', function()
    local pool, sb
    setup(function()
      pool = prov.make_pool({ max_sandboxes = 2 })
      sb = pool:create({ lifetime_ms = 300000 })
      common.install(sb)
    end)
    teardown(function()
      if sb then sb:release() end
      pool:close()
    end)

    it('refuses every class of system call it filters with EPERM, clone3 with ENOSYS', function()
      local r, kv = common.abuse(sb, { 'syscalls' }, { timeout_ms = 20000 })
      assert.are.equal(0, r.exit_code, r.stderr)
      assert.is_true(filtered(sb, kv), 'no seccomp filter: ' .. r.stdout)
      for _, name in ipairs(DENIED) do
        if prov.gvisor and name == 'abi_i386' then
          assert.is_true(kv['deny.' .. name] ~= nil and kv['deny.' .. name] ~= 'OK', r.stdout)
        else
          assert.are.equal('EPERM', kv['deny.' .. name], name .. ' was not refused by the filter: ' .. r.stdout)
        end
      end
      -- its flags are in memory a filter cannot read: ENOSYS makes the C library fall back to clone
      assert.are.equal('ENOSYS', kv['deny.clone3'], r.stdout)
    end)

    it('keeps what ordinary work needs: fork, threads, sockets, netlink route, its own priorities', function()
      local r, kv = common.abuse(sb, { 'syscalls' }, { timeout_ms = 20000 })
      assert.are.equal(0, r.exit_code, r.stderr)
      for _, name in ipairs(ALLOWED) do
        local want = prov.gvisor and GVISOR_LACKS[name] or 'OK'
        assert.are.equal(want, kv['allow.' .. name], name .. ' was refused: ' .. r.stdout)
      end
      -- the command's own process is a child subreaper, as the agent made it (gVisor has none)
      assert.are.equal(prov.gvisor and '-1' or '1', kv.subreaper, r.stdout)
      r = sh(sb, 'mkdir -p a/b/c && cd a/b/c && echo hi > f && cat f && ls /proc/self/ >/dev/null && ' ..
        '(sleep 0.1 & wait) && echo done')
      assert.are.equal(0, r.exit_code, r.stderr)
      assert.are.equal('hi\ndone\n', r.stdout)
    end)

    it('runs node (threads, fs, child processes)', function()
      local box, nodepool = sb, nil
      if prov.kind == 'docker' then
        nodepool = prov.make_pool({ max_sandboxes = 1, image = 'mayura-test/node:1', memory_mib = 256 })
        box = nodepool:create({ lifetime_ms = 120000 })
      end
      local ok, err = pcall(function()
        local r = box:exec({ 'node', '-e', [[
          const fs = require('fs'), cp = require('child_process');
          fs.writeFileSync('n.txt', 'from node');
          fs.readFile('n.txt', 'utf8', (e, d) => {
            if (e) throw e;
            console.log(d, cp.execSync('echo child').toString().trim());
          });
        ]] }, { timeout_ms = 60000 })
        assert.are.equal(0, r.exit_code, r.stderr)
        assert.are.equal('from node child\n', r.stdout)
      end)
      if nodepool then
        box:release()
        nodepool:close()
      end
      if not ok then error(err, 0) end
    end)

    it('starts every command filtered, also after code inside stopped or killed every process it may', function()
      if prov.gvisor then
        -- no helper there (its CLONE_PARENT children never reach PID 1's wait), and gVisor lets a
        -- `kill -KILL -1` of the sandbox's user end its PID 1: the sandbox is then gone, nothing else
        return pending('gVisor: commands are forked by the agent, each filtered; PID 1 is not shielded')
      end
      if prov.kind == 'kubernetes' then
        -- the agent is PID 2 under bubblewrap's init in the stand-in's pods (a runtime makes it PID 1,
        -- shielded from its namespace): `kill -KILL -1` ends it there
        return pending('the Kubernetes stand-in: the agent is not PID 1 of its pods')
      end
      -- the agent starts commands through a filtered helper of its own, which the sandbox's code can
      -- signal: stopped, it is resumed; killed, the agent forks commands itself, each filtered
      local other = pool:create({ lifetime_ms = 120000 })
      local ok, err = pcall(function()
        common.install(other)
        for _, sig in ipairs({ 'STOP', 'KILL' }) do
          sh(other, 'kill -' .. sig .. ' -1 2>/dev/null; true')
          for _ = 1, 3 do
            assert.are.equal('still\n', other:exec({ 'echo', 'still' }).stdout, 'after SIG' .. sig)
          end
          local r, kv = common.abuse(other, { 'syscalls' }, { timeout_ms = 20000 })
          assert.are.equal(0, r.exit_code, r.stderr)
          assert.is_true(tonumber(kv.filters) >= 1, 'after SIG' .. sig .. ': ' .. r.stdout)
          assert.are.equal('EPERM', kv['deny.mount'], r.stdout)
          assert.are.equal('EPERM', kv['deny.setpriority_other'], r.stdout)
          assert.are.equal('1', kv.subreaper, r.stdout)
          if sig == 'STOP' then
            -- the helper: the agent's program, not PID 1; it cannot be traced or read
            local helper = sh(other, 'for d in /proc/[0-9]*; do [ "${d#/proc/}" != 1 ] && ' ..
              'grep -q "^/.mayura/agent" $d/cmdline 2>/dev/null && echo ${d#/proc/}; done; true').stdout:match('%d+')
            assert.is_not_nil(helper, 'no helper process in the sandbox')
            local pr, pkv = common.abuse(other, { 'ptrace', helper })
            for _, k in ipairs({ 'attach', 'seize', 'mem', 'vm_readv', 'getfd' }) do
              assert.matches('^E', pkv[k], k .. ' of the helper succeeded: ' .. pr.stdout)
            end
          end
        end
      end)
      other:release()
      if not ok then error(err, 0) end
    end)

    if prov.kind == 'docker' then
      it("lets no code inside reach the agent's socket: the host's later commands keep their env and workdir",
        function()
          local other = pool:create({ lifetime_ms = 120000, env = { KEEP = 'host-value' } })
          local ok, err = pcall(function()
            common.install(other)
            local r, kv = common.abuse(other, { 'agent', '/.mayura/run/agent.sock' }, { timeout_ms = 20000 })
            assert.are.equal(0, r.exit_code, r.stderr)
            assert.is_not_nil(kv.connect, r.stdout)
            if kv.connect == 'OK' then
              -- connected: then never answered
              for _, op in ipairs({ 'hello', 'setup', 'exec' }) do
                assert.are_not.equal('ANSWERED', kv[op], op .. ' was answered: ' .. r.stdout)
              end
            else
              assert.is_truthy(kv.connect:match('^E'), r.stdout)
            end
            -- nothing can be put beside the socket either
            r = sh(other, 'touch /.mayura/run/x 2>/dev/null && echo made; ls -A /.mayura/run')
            assert.is_nil(r.stdout:find('made', 1, true), r.stdout)
            r = sh(other, 'echo "$KEEP"; pwd')
            assert.are.equal('host-value\n/workspace\n', r.stdout)
          end)
          other:release()
          if not ok then error(err, 0) end
        end)
    end
  end)
end
