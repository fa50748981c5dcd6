-- The specs' policy: the workspace tools of examples/policies/workspace.lua, with remove declared
-- but not granted (a denied tool).
pool 'workspace' {
  provider = 'local',
  max_sandboxes = 6,
  max_lifetime_ms = 10 * 60000,
  max_exec_timeout_ms = 60000,
  sandbox = { lifetime_ms = 5 * 60000 },
}

tools 'workspace' { exec = true, write = true }

agent 'workspace' {
  tools = { 'workspace' },
  allow = {
    'tool:workspace.read', 'tool:workspace.list', 'tool:workspace.write', 'tool:workspace.exec',
    'sandbox:workspace:read', 'sandbox:workspace:write', 'sandbox:workspace:exec', 'effect:read', 'effect:write',
  },
}

serve { agent = 'workspace', max_sessions = 4 }
