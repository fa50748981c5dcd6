--- A policy for a tool host: one pool on the local provider, a sandbox per session, and the
-- workspace tools (read, list, write, remove, exec) granted.
--
--   build/mayura --policy examples/policies/workspace.lua app.lua   -- app.lua: mayura.policy()
--
-- Each session (or run) gets a sandbox of its own on its first call that needs one, with no
-- network, released when the session closes or after 30 minutes, whichever comes first.

pool 'workspace' {
  provider = 'local',              -- bubblewrap namespaces on this machine
  max_sandboxes = 16,              -- one per session: at most 16 at once
  max_lifetime_ms = 60 * 60000,
  network = { 'none' },
  max_exec_timeout_ms = 10 * 60000,
  sandbox = { lifetime_ms = 30 * 60000, network = 'none' },
}

tools 'workspace' {
  pool = 'workspace',
  exec = true,                     -- workspace.exec
  write = true,                    -- workspace.write, workspace.remove
  exec_timeout_ms = 120000,        -- a command runs at most 2 minutes
}

agent 'workspace' {
  description = 'Reads, writes and runs commands in a sandbox of its own.',
  tools = { 'workspace' },
  allow = {
    'tool:workspace.read', 'tool:workspace.list', 'sandbox:workspace:read', 'effect:read',
    'tool:workspace.write', 'tool:workspace.remove', 'sandbox:workspace:write',
    'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write',
  },
  limits = { max_tool_calls = 1000 },
}

serve { agent = 'workspace', max_sessions = 16 }
