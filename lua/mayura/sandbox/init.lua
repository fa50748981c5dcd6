--- mayura.sandbox: the sandbox pool, and what providers and tools share.
--
-- `create_sandboxes(provider, options)` holds every sandbox of a provider to
-- the same limits. The pool checks every path, size and option before it
-- calls the provider, and everything the provider returns before the caller
-- sees it; a provider call that takes longer than `call_timeout_ms` fails
-- with SANDBOX_ERROR reason `timeout`; after its lifetime or release every
-- call on a sandbox fails with SANDBOX_ERROR reason `gone`.
--
-- Network: each kind other than 'none' must be listed in the pool's
-- `network` (asking for another fails with PERMISSION_DENIED); 'none' needs no
-- listing: a create that asks for none gets 'none' from any pool, and fails with
-- INVALID_INPUT only when the provider cannot keep a sandbox offline.
--
-- Network events: a provider that filters the network (an allow-list) tells each refusal to
-- `spec.on_event(event)`; the pool stamps it with the sandbox's id (`event.sandbox`), keeps the
-- last MAX_EVENTS of each sandbox for `sandbox:events()` (a copy, oldest first) and hands it to
-- the pool's `on_event(event)` option when there is one (an error there is reported through
-- core.report, never raised into the provider). The allow-list's events are
-- `{ type = 'network_refused', sandbox, host, port, reason }` (mayura.sandbox._egress).
--
-- Providers by name: `provider(name, options)` is mayura.sandbox.<name>'s `sandboxes(options)`
-- (`providers()` lists mayura's own); a name of another shape, or of no provider, is INVALID_INPUT.
--
-- A provider is a table (docs/writing-a-provider.md; ARCHITECTURE.md):
--   { id, features = { stdin, ports, desktop, network = { 'none', 'all', 'allowlist' } },
--     workdir, max_lifetime_ms, create = function(self, spec) return backend end }
-- (`spec` holds the checked create options, the merged labels and the pool's
-- `call_timeout_ms`, for providers whose calls go over the network)
-- and a backend has `id`, `exec(argv, opts)`, `read_file(path, opts)`,
-- `write_file(path, data)`, `list_files(path)`, `remove_file(path, opts)`,
-- `url(port)`, `release()` and optionally `desktop`.
--
-- Warm sandboxes: a provider with `warm_attach` (local, Docker and the hosted ones
-- on mayura.sandbox._kit, with their option `warm`; mayura.sandbox._warm) keeps sandboxes
-- started ahead for the first pool made over it (from its making, or from its
-- first create with the pool option `warm_start = 'first_use'`). They take slots of its
-- max_sandboxes: `count()` plus the provider's `warm_held()` never passes
-- it; the provider starts one only in a free slot, a create that gets one
-- (`warm_claim`, then `create(self, spec, claimed)`) moves its slot to the
-- pool, a create of another shape finding no free slot has one destroyed
-- first (`warm_evict`), and `close()` ends them all (`warm_detach`).
--
-- Snapshots: `sandbox:snapshot()` keeps the sandbox's files (its working directory, /tmp, a
-- provider's `snapshot_paths`) as `{ id, size_bytes, provider }` with `release()`;
-- `create{ snapshot = snap }` starts a sandbox with them, `sandbox:restore(snap)` puts them back in
-- one (a snapshot made `{ until_release = true }` ends with its sandbox). The pool checks that the snapshot is its
-- own and not released (INVALID_INPUT), bounds them by `max_snapshots` and `max_snapshot_bytes`
-- (their sizes together; LIMIT_EXCEEDED past either, nothing kept) and releases them at close().
-- `features.snapshots` is the provider's: 'native' (its backend's `snapshot(o)` returns a
-- snapshot of its own, `{ size_bytes, release }` and optionally `archive()` for restore, which its
-- create gets as `spec.snapshot`; one made `{ until_release = true }` is made the generic way, so
-- that restore can put it back on any provider),
-- false (none), or by default 'generic' (mayura.sandbox._snapshot: an archive made in the
-- sandbox, kept in this process's memory and unpacked in the new sandbox before it is handed out).
--
-- Streaming: `sandbox:exec(argv, { on_stdout = fn, on_stderr = fn })` and
-- `sandbox:start(argv, opts)` (a handle: `pid`, `wait()`, `kill(signal)`,
-- `output()`). The pool passes the backend's exec `o.on_output(name, chunk)`
-- and `o.on_start(ctl)` (ctl = `{ pid, kill(signal_number) }`, once the
-- command runs); a backend that calls them as things happen says
-- `streaming = true` (start then returns once on_start came). Whatever a
-- backend did not stream reaches the callbacks when the command ends; a
-- backend without `ctl.kill` has `kill()` cancel the command (wait() then
-- gives the output so far, `signal` the one asked for).
--
-- Desktop: `create{ desktop = true }` asks for one (INVALID_INPUT when the
-- provider's `features.desktop` is false); `sandbox.desktop` is then the
-- backend's `desktop` behind the pool's checks: `screenshot()` (PNG bytes),
-- `click{ x, y, button }`, `double_click{ x, y, button }`, `move{ x, y }`,
-- `scroll{ direction, amount, x, y }`, `drag{ from = { x, y }, to = { x, y },
-- button }`, `type(text)`, `key(name)`, `size()` (`{ width, height }`) and
-- `view_url()` (INVALID_INPUT from a provider without a live view), each
-- called with `:`. A backend's desktop has the same methods and gets checked
-- arguments (x, y whole numbers, button 'left' by default, amount 1..100);
-- it may leave out double_click, drag and view_url.
--
-- This module is the front; the mechanisms are private files: the pool (mayura.sandbox._pool),
-- its sandbox object (_sandbox), commands and their streams (_exec), the pool's side of snapshots
-- (_pool_snapshots), the desktop's checks (_sandbox_desktop), and the checks and deadline they
-- share (_checks).
local errors = require('mayura.errors')
local checks = require('mayura.sandbox._checks')
local pool = require('mayura.sandbox._pool')

local M = {}

M.is_error = errors.is

--- Normalizes a sandbox path: absolute, or relative to `workdir`; `.` and
-- `..` are folded lexically (inside the sandbox's own root, so `..` cannot
-- leave it). Raises INVALID_INPUT for a path that is not a usable string.
M.normalize_path = checks.normalize_path

--- Holds every sandbox from `provider` to the same limits (mayura.sandbox._pool).
M.create_sandboxes = pool.create_sandboxes

--- Maps an HTTP status to a SandboxError: 401/403 authentication, 404 not_found,
-- 409 conflict, 408/504 timeout, 429 rate_limited, other 5xx unavailable, else failed.
function M.sandbox_http_failure(status)
  local reason
  if status == 401 or status == 403 then reason = 'authentication'
  elseif status == 404 then reason = 'not_found'
  elseif status == 409 then reason = 'conflict'
  elseif status == 408 or status == 504 then reason = 'timeout'
  elseif status == 429 then reason = 'rate_limited'
  elseif type(status) == 'number' and status >= 500 and status <= 599 then reason = 'unavailable'
  else reason = 'failed' end
  local e = errors.sandbox(reason, 'the provider answered HTTP ' .. tostring(status))
  e.status = status
  return e
end

--- Runs `fn()` as a task and waits for it at most `ms`; past that raises
-- SANDBOX_ERROR reason `timeout` (the call goes on; `on_late(ok, ...)` gets its result).
M.with_deadline = checks.with_deadline

-- {======================================================
-- Providers by name
-- =======================================================

-- The providers mayura ships: each is the module mayura.sandbox.<name>, whose `sandboxes` is its
-- own `<name>_sandboxes`.
local PROVIDERS = { 'agentcore', 'apple_container', 'cloudflare', 'codesandbox', 'daytona', 'docker', 'e2b',
  'e2b_desktop', 'fly', 'kubernetes', 'local', 'modal', 'northflank', 'railway', 'vercel' }
-- The library's own modules of the same namespace: never providers, never loaded by name.
local NOT_PROVIDERS = { init = true, command = true, per_run = true, scripts = true, testing = true,
  tools = true }

local function bad_provider(name, message)
  errors.raise('INVALID_INPUT', message, { unknown_provider = name }, 3)
end

--- The names of the providers mayura ships, sorted (a new list each call).
function M.providers()
  local out = {}
  for i, name in ipairs(PROVIDERS) do out[i] = name end
  return out
end

--- The provider named `name`: `require('mayura.sandbox.' .. name).sandboxes(options, how)`, the same
-- function as that module's `<name>_sandboxes` (`how`: local and Docker take `{ check = true }`).
-- A name is lowercase letters, digits and `_`, starting with a letter: one of providers(), or the
-- module of another provider on the module path (one that exports a `sandboxes` function). Any
-- other name raises INVALID_INPUT (with `unknown_provider` = the name) having loaded nothing but,
-- for a well-formed name, the module mayura.sandbox.<name> when there is one.
function M.provider(name, options, how)
  if type(name) ~= 'string' then bad_provider(name, 'a provider name must be a string') end
  if #name > 64 or not name:match('^[a-z][a-z0-9_]*$') then
    bad_provider(name, 'provider name ' .. string.format('%q', name:sub(1, 64)) .. ' is not valid: lowercase '
      .. 'letters, digits and _, starting with a letter, at most 64 bytes')
  end
  if NOT_PROVIDERS[name] then bad_provider(name, 'mayura.sandbox.' .. name .. ' is not a provider') end
  local module = 'mayura.sandbox.' .. name
  local ok, mod = pcall(require, module)
  if not ok then
    -- no such module: an unknown name; a module that fails as it loads fails as itself
    if type(mod) == 'string' and mod:find("module '" .. module .. "' not found", 1, true) then
      bad_provider(name, "unknown provider '" .. name .. "' (mayura's: " .. table.concat(PROVIDERS, ', ') .. ')')
    end
    error(mod, 0)
  end
  if type(mod) ~= 'table' or type(mod.sandboxes) ~= 'function' then
    bad_provider(name, module .. ' is not a provider: it exports no sandboxes(options)')
  end
  return mod.sandboxes(options, how)
end

-- }======================================================

--- Tools that let an agent work in a sandbox (mayura.sandbox.tools).
function M.sandbox_tools(source, options)
  return require('mayura.sandbox.tools').sandbox_tools(source, options)
end

--- A sandbox for each run, created the first time one of its tools needs it (mayura.sandbox.per_run).
function M.sandbox_per_run(sandboxes, options)
  return require('mayura.sandbox.per_run').sandbox_per_run(sandboxes, options)
end

--- sh scripts for providers whose API only runs commands, and their listing's parser
-- (mayura.sandbox.scripts).
M.sandbox_scripts = require('mayura.sandbox.scripts')
M.parse_sandbox_listing = M.sandbox_scripts.parse_listing

--- The whole backend contract from a transport that runs short commands (mayura.sandbox.command).
function M.command_sandbox_backend(id, transport, release)
  return require('mayura.sandbox.command').command_sandbox_backend(id, transport, release)
end

return M
