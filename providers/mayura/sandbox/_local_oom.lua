--- mayura.sandbox._local_oom: whether a local sandbox's agent is shielded from the OOM killer.
--
-- mayura-launch (launcher/launch.c) shields itself, and so the agent it becomes, with
-- oom_score_adj -1000 set through the legacy oom_adj knob (which, unlike oom_score_adj, leaves the
-- floor the agent's commands may go down to at 0, so they cannot take the shield back). The
-- kernel refuses it without CAP_SYS_RESOURCE, and some refuse root too: the provider asks here
-- once (`enforced.oom_protected`) and says so on stderr once when it cannot, since the tmpfs caps
-- count toward `memory_mib` and may add up to more than it, and an agent left unshielded may then
-- be what the kernel kills. Private to the local provider.
local core = require('mayura.core')

local M = {}

local shield_works, warned

--- Whether a process here can shield itself from the OOM killer the way mayura-launch does.
-- Asked once per process.
function M.shield_works()
  if shield_works == nil then
    local ok, r = pcall(require('mayura.process').run,
      { '/bin/sh', '-c', 'echo -17 > /proc/self/oom_adj; cat /proc/self/oom_score_adj' },
      { env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' } })
    shield_works = ok and r.stdout == '-1000\n'
  end
  return shield_works
end

--- Says that the agents are not shielded, once per process (core.report_once: a runner that
-- reloads modules does not repeat it).
function M.warn_unshielded()
  if warned then return end
  warned = true
  core.report_once('the kernel refuses to shield local sandbox agents from the OOM killer ' ..
    '(oom_score_adj -1000); a sandbox whose tmpfs fill its memory may lose its agent ' ..
    '(provider.enforced.oom_protected is false)')
end

return M
