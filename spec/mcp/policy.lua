-- The specs' policy: the workspace tools of examples/policies/workspace.lua, with remove declared
-- but not granted (a denied tool), and progress every 100 ms.
return {
  pool = { provider = 'local', max_sandboxes = 6, max_lifetime_ms = 600000, max_exec_timeout_ms = 60000 },
  sandbox = { lifetime_ms = 300000 },
  tools = { name = 'workspace', exec = true, write = true },
  grants = {
    'tool:workspace.read', 'tool:workspace.list', 'tool:workspace.write', 'tool:workspace.exec',
    'sandbox:workspace:read', 'sandbox:workspace:write', 'sandbox:workspace:exec', 'effect:read', 'effect:write',
  },
  serve = { max_sessions = 4, progress_interval_ms = 100 },
}
