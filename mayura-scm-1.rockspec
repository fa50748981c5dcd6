rockspec_format = '3.0'
package = 'mayura'
version = 'scm-1'
source = { url = 'git+https://example.invalid/mayura.git' }
description = {
  summary = 'Isolated Linux sandboxes for AI agents, with permissions, limits and budgets.',
  detailed = [[
A C core (one event loop shared with luv, processes, files, HTTP through
libcurl, JSON through cJSON, Linux namespaces) under a Lua layer: the sandbox
pool, providers, tools, permissions, hooks and the agent runtime.]],
  license = 'MIT',
}
-- Lua 5.4, or LuaJIT 2.1 (the 5.1 ABI: `luarocks --lua-version 5.1 make` with LuaJIT as its interpreter).
dependencies = { 'lua >= 5.1, < 5.5', 'luv' }
external_dependencies = {
  CURL = { library = 'curl' },   -- by its library: Debian keeps curl/curl.h in a multiarch folder
  UV = { header = 'uv.h' },
  CJSON = { header = 'cjson/cJSON.h' },
  MSGPACK = { header = 'msgpack.h' },
  PROTOBUFC = { header = 'protobuf-c/protobuf-c.h' },
  WEBSOCKETS = { header = 'libwebsockets.h' },
  SECCOMP = { header = 'seccomp.h' },
}
build = {
  type = 'make',
  build_variables = { CFLAGS = '$(CFLAGS)', LUA = '$(LUA)' },
  install_variables = { PREFIX = '$(PREFIX)', LUADIR = '$(LUADIR)', LIBDIR = '$(LIBDIR)', LUA = '$(LUA)' },
}
test_dependencies = { 'busted' }
test = { type = 'busted' }
