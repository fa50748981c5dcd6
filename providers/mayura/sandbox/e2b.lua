--- mayura.sandbox.e2b: sandboxes on E2B (Firecracker microVMs from a template).
--
--   local e2b = require('mayura.sandbox.e2b')
--   local sandboxes = sandbox.create_sandboxes(e2b.e2b_sandboxes({ api_key = key, template = 'base' }), {
--     max_sandboxes = 20, max_lifetime_ms = 3600000,
--   })
--
-- Options:
--   api_key          required: the E2B API key. The library reads nothing from the
--                    environment; the caller passes the key (the example reads E2B_API_KEY)
--   template         the template ID or alias sandboxes start from ('base')
--   domain           E2B's domain ('e2b.app'): the API is https://api.<domain>, a sandbox's
--                    envd https://49983-<id>.<domain>, a port's URL https://<port>-<id>.<domain>
--   api_url          the control plane's URL instead (a self-hosted E2B, a stand-in)
--   sandbox_url      one URL for every sandbox's envd, which then tells them apart by the
--                    E2b-Sandbox-Id header (as the official SDK's sandboxUrl)
--   workdir          the template's working directory, where relative paths go ('/home/user')
--   max_lifetime_ms  the longest lifetime (24 h, E2B Pro; the Hobby plan allows 1 h)
--   secure           taken and ignored, as by the SDK: every sandbox is secured (its envd
--                    wants the access token of its create)
--   retries, retry_base_ms   the hosted kit's retries of 429 and 5xx (2, 200 ms)
--   warm             sandboxes made ahead for the pool (0 to 64, none by default;
--                    mayura.sandbox._kit): a create with the pool's labels, no image and the
--                    network 'none' takes one, its env going with each command and its
--                    lifetime to E2B's timeout
--
-- A sandbox's lifetime becomes E2B's timeout (seconds, rounded up), so a sandbox
-- nobody released still ends; its labels become E2B metadata (with one of the
-- provider's own, `mayura.create`); `image` picks another template; `cpus` and
-- `memory_mib` are refused with INVALID_INPUT (E2B sets them per template).
-- Network: 'none', 'all', or { allow = domains } (E2B filters domains on ports
-- 80 and 443). Ports need no declaring at E2B: url(port) is
-- https://<port>-<id>.<domain>. Commands take standard input (envd 0.5.2 and
-- later); a timeout or a cancel ends every process the command started.
-- Snapshots are E2B's own (`features.snapshots` 'native'): sandbox:snapshot() is E2B's snapshot
-- (the sandbox paused while it is made: its whole disk and its memory, so what ran in it runs on
-- in a sandbox made from it), create{ snapshot = snap } starts from it as a template, release
-- deletes it on the service. E2B says no size of a snapshot: its size_bytes is 0, and only
-- max_snapshots bounds them (docs/snapshots.md).
-- Failures are SANDBOX_ERROR with a reason (authentication, rate_limited,
-- gone, ...), never with E2B's own text. How it talks to E2B:
-- mayura.sandbox._e2b.
local e2b = require('mayura.sandbox._e2b')

local M = {}

M.FEATURES = { stdin = true, ports = true, desktop = false, network = { 'none', 'all', 'allowlist' },
  snapshots = 'native' }

--- The provider: see the module's comment for the options.
function M.e2b_sandboxes(options)
  local config = e2b.config(options, { label = 'e2b', template = 'base' })
  local features = { network = {} }
  for k, v in pairs(M.FEATURES) do if k ~= 'network' then features[k] = v end end
  for i, kind in ipairs(M.FEATURES.network) do features.network[i] = kind end
  return e2b.provider(config, { id = 'e2b', features = features })
end

M.sandboxes = M.e2b_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
