-- workspace.lua: one pool on the local provider, a sandbox per session, and
-- its workspace tools (read, list, write, remove, exec) granted.
--   build/mayura serve --policy examples/policies/workspace.lua
return {
  pool = { provider = 'local', max_sandboxes = 8, max_lifetime_ms = 3600000, max_exec_timeout_ms = 300000 },
  sandbox = { lifetime_ms = 1800000 },
  tools = { name = 'workspace', exec = true, write = true },
  grants = {
    'tool:workspace.read', 'tool:workspace.list', 'tool:workspace.write', 'tool:workspace.remove',
    'tool:workspace.exec', 'sandbox:workspace:read', 'sandbox:workspace:write', 'sandbox:workspace:exec',
    'effect:read', 'effect:write',
  },
  limits = { max_tool_calls = 10000 },
  serve = { max_sessions = 8 },
}
