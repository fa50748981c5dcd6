-- The local provider's cold-create pieces: mayura-stage (launcher/stage.c, the launcher's first
-- step), the host-linked agent of sandboxes without an image, and core.spawn's `outlive`.
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local core = require('mayura.core')
local task = require('mayura._task')
local uv = require('luv')

local STAGE = 'build/mayura-stage'
local AGENT_HOST = 'build/mayura-agent-host'
local root = require('mayura.sandbox._host').uid() == 0

-- Runs mayura-stage with `env` and `argv`, its fd 5 holding `bytes` (the agent's, in the launcher).
local function stage(env, argv, bytes)
  local path = os.tmpname()
  local f = assert(io.open(path, 'wb'))
  f:write(bytes)
  f:close()
  local fd = assert(uv.fs_open(path, 'r', 0))
  os.remove(path)
  local full = { STAGE }
  for _, a in ipairs(argv) do full[#full + 1] = a end
  local res = task.await(function(done)
    assert(core.spawn({ argv = full, env = env, fds = { fd, fd, fd } }, done))
  end)
  uv.fs_close(fd)
  return res
end

describe('mayura-stage', function()
  it('hands bubblewrap the agent on 0 and the /etc texts on 5..9, each with its newline', function()
    local res = stage({ PATH = '/usr/bin:/bin', MAYURA_ETC_FDS = '1', MAYURA_ETC_1 = 'one', MAYURA_ETC_2 = 'two\nlines',
      MAYURA_ETC_3 = '', MAYURA_ETC_4 = '$HOME \\n', MAYURA_ETC_5 = 'five' },
      { '/bin/sh', '-c', 'cat; echo "|"; for f in 5 6 7 8 9; do cat <&$f; done' }, 'AGENT')
    assert.are.equal(0, res.exit_code)
    assert.are.equal('AGENT|\none\ntwo\nlines\n\n$HOME \\n\nfive\n', res.stdout)
  end)

  it('does not run the command when it cannot join a cgroup', function()
    local res = stage({ MAYURA_CG = '/nonexistent/cgroup' }, { '/bin/sh', '-c', 'echo ran' }, '')
    assert.are.equal(125, res.exit_code)
    assert.are.equal('', res.stdout)
  end)

  it('takes the sandbox uid without groups or capabilities before it becomes the command', function()
    if not root then return pending('needs root: the provider takes a host uid only as root') end
    local res = stage({ MAYURA_UID = '1299999' },
      { '/bin/sh', '-c', 'id -u; id -g; id -G; grep -E "^(CapPrm|CapEff):" /proc/self/status' }, '')
    assert.are.equal(0, res.exit_code)
    assert.are.equal('1299999\n1299999\n1299999\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n', res.stdout)
  end)
end)

describe('a local sandbox without an image', function()
  it('runs the agent linked against the host\'s libraries, and its launcher outlives nothing of the host', function()
    local want = uv.fs_stat(AGENT_HOST)
    if not want then return pending(AGENT_HOST .. ' is not built') end
    local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(), { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local sb = pool:create({ lifetime_ms = 60000 })
    assert.are.equal(tostring(want.size) .. '\n', sb:exec({ 'sh', '-c', 'wc -c < /.mayura/agent' }).stdout)
    -- the launcher carries no tag of the host's process tree (core.spawn's outlive)
    local env = io.open('/proc/' .. sb._backend.proc:pid() .. '/environ', 'rb')
    local text = env and env:read('a') or ''
    if env then env:close() end
    assert.is_nil(text:find('MAYURA_TREE=', 1, true))
    assert.is_truthy(text:find('MAYURA_LIFE=', 1, true))
    pool:close()
  end)
end)
