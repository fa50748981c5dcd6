-- luacheck configuration. The Lua layer stays in the subset shared by Lua 5.4 and LuaJIT 2.1.
std = 'lua54'
cache = true
max_line_length = 120
files['spec/**/*.lua'] = { std = '+busted', max_line_length = 140 }
files['fuzz/*.lua'] = { max_line_length = 140 }
files['.busted'] = { std = 'lua54' }
ignore = { '212/_.*' }
-- `unpack` is read only where `table.unpack` is missing (LuaJIT).
read_globals = { 'unpack' }
-- Policy files run in mayura.policy's environment, whose declarations are their globals.
files['examples/policies/*.lua'] = { read_globals = { 'pool', 'tools', 'tool', 'hook', 'agent', 'serve', 'z' } }
files['spec/mcp/*.lua'] = { std = '+busted', max_line_length = 140, read_globals = { 'pool', 'tools', 'tool', 'hook', 'agent', 'serve', 'z' } }
