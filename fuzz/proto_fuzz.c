/*
** proto_fuzz: core.proto.decode and encode through a real lua_State, for every method of
** the .proto files of proto/ (the first byte picks the method and whether its request or its response).
**
**  - decode(bytes) never raises: a value, or nil + INVALID_OUTPUT;
**  - a decoded value encodes (or, for a uint64 above 2^63, which comes back as a float, is
**    refused with INVALID_INPUT), and those bytes decode to an equal value.
*/
#include "fuzz_lua.h"

static const char *fz_proto_src =
    "local P = require('mayura.core').proto\n"
    "local methods = P.methods()\n"
    "local function eq(a, b)\n"
    "  if type(a) ~= type(b) then return false end\n"
    "  if type(a) ~= 'table' then return a == b or (a ~= a and b ~= b) end\n"
    "  for k, v in pairs(a) do if not eq(v, b[k]) then return false end end\n"
    "  for k in pairs(b) do if a[k] == nil then return false end end\n"
    "  return true\n"
    "end\n"
    "return function(data)\n"
    "  if #data == 0 then return 'ok' end\n"
    "  local c = data:byte(1)\n"
    "  local m = methods[c % #methods + 1]\n"
    "  local dir = c >= 128 and 'response' or 'request'\n"
    "  local v, err = P.decode(m, dir, data:sub(2))\n"
    "  if v == nil then\n"
    "    if type(err) ~= 'table' or err.code ~= 'INVALID_OUTPUT' then return 'decode failed without INVALID_OUTPUT' end\n"
    "    return 'ok'\n"
    "  end\n"
    "  local ok, b = pcall(P.encode, m, dir, v)\n"
    "  if not ok then\n"
    "    if type(b) == 'table' and b.code == 'INVALID_INPUT' then return 'ok' end\n"
    "    return 'encode raised ' .. tostring(b)\n"
    "  end\n"
    "  local v2 = P.decode(m, dir, b)\n"
    "  if v2 == nil then return 'decode refused what encode gave' end\n"
    "  if not eq(v, v2) then return 'decode(encode(v)) differs from v' end\n"
    "  return 'ok'\n"
    "end\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    const char *verdict;
    lua_getfield(L, LUA_REGISTRYINDEX, "fuzz.proto");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        if (luaL_loadstring(L, fz_proto_src) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK)
            fz_fail("the proto check does not load: %s", fz_describe(L, -1));
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "fuzz.proto");
    }
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) fz_fail("proto raised: %s", fz_describe(L, -1));
    verdict = lua_tostring(L, -1);
    if (verdict == NULL || strcmp(verdict, "ok") != 0) fz_fail("%s", verdict ? verdict : "no verdict");
    fz_end(L);
    return 0;
}
