/*
** listing_fuzz: the directory listing the sandbox_scripts.list script prints,
** through parse_sandbox_listing (mayura.sandbox.scripts, pure Lua).
**
** The input is the listing's text itself when the first byte is odd. Else the
** rest builds a listing that has the right shape, so that the name checks are
** reached: each entry is a selector byte (the mode among file, directory,
** symlink, fifo, socket, block device; bit 7: a milliseconds fraction), a size
** byte, an mtime byte, [a fraction byte], a name length byte (0..11) and the
** name's bytes, written as a line '<mode> <size> <mtime> <name as hex>'.
**
** The parser is Lua, which libFuzzer's instrumentation does not see: the
** steps between its lines are counted as features (fz_cover_lua).
**
** Whatever the text, the parser returns nil, or entries the pool promises (a
** non-empty name without '/' or NUL, a known type, whole size >= 0, whole
** modified), or raises a coded error; a plain Lua error is a bug. A built
** listing must be accepted exactly when all its names are valid, with every
** entry as built, and refused with SANDBOX_ERROR reason 'failed' otherwise.
*/
#include "fuzz_lua.h"

static const char harness_lua[] =
    "local sandbox = require('mayura.sandbox')\n"
    "local errors = require('mayura.errors')\n"
    "local parse = sandbox.parse_sandbox_listing\n"
    "local TYPES = { file = true, directory = true, symlink = true, other = true }\n"
    "local MODES = { { '81a4', 'file' }, { '41ed', 'directory' }, { 'a1ff', 'symlink' }, { '11a4', 'other' },\n"
    "  { 'c1ed', 'other' }, { '61b0', 'other' } }\n"
    "local function int(v) return math.type(v) == 'integer' end\n"
    "local verbose = os.getenv('FUZZ_VERBOSE')\n"
    "local function check(ok, res)\n"
    "  if not ok then\n"
    "    if not errors.is(res) then return 'a plain error: ' .. tostring(res) end\n"
    "    if verbose then io.stderr:write('listing refused: ', tostring(res), '\\n') end\n"
    "    return nil\n"
    "  end\n"
    "  if res == nil then return nil end\n"
    "  if type(res) ~= 'table' then return 'the listing is a ' .. type(res) end\n"
    "  for i, e in ipairs(res) do\n"
    "    if type(e.name) ~= 'string' or e.name == '' or e.name:find('[/%z]') or not TYPES[e.type]\n"
    "      or not int(e.size) or e.size < 0 or not int(e.modified) then\n"
    "      return 'entry ' .. i .. ' is not what the pool promises'\n"
    "    end\n"
    "  end\n"
    "  return nil\n"
    "end\n"
    "return function(data)\n"
    "  if #data == 0 then return nil end\n"
    "  if data:byte(1) % 2 == 1 then return check(pcall(parse, data:sub(2))) end\n"
    "  local pos, lines, want, valid = 2, { 'L' }, {}, true\n"
    "  local function byte() local b = data:byte(pos) or 0; pos = pos + 1; return b end\n"
    "  while pos <= #data do\n"
    "    local sel = byte()\n"
    "    local mode = MODES[sel % 6 + 1]\n"
    "    local size, mtime, frac = byte() * 257, byte() * 1000003, ''\n"
    "    local ms = mtime * 1000\n"
    "    if sel >= 128 then\n"
    "      local f = byte() * 3 % 1000\n"
    "      frac, ms = string.format('.%03d', f), ms + f\n"
    "    end\n"
    "    local n = byte() % 12\n"
    "    local name = data:sub(pos, pos + n - 1)\n"
    "    pos = pos + n\n"
    "    local hex = name:gsub('.', function(c) return string.format('%02x', c:byte()) end)\n"
    "    lines[#lines + 1] = mode[1] .. ' ' .. size .. ' ' .. mtime .. frac .. ' ' .. hex\n"
    "    if name == '' or name:find('[/%z]') or name == '.' or name == '..' then valid = false end\n"
    "    want[#want + 1] = { name = name, type = mode[2], size = size, modified = ms }\n"
    "  end\n"
    "  lines[#lines + 1] = 'end'\n"
    "  local ok, res = pcall(parse, table.concat(lines, '\\n') .. '\\n')\n"
    "  local why = check(ok, res)\n"
    "  if why then return why end\n"
    "  if not ok then\n"
    "    if valid then return 'a valid listing was refused: ' .. tostring(res) end\n"
    "    if res.code ~= 'SANDBOX_ERROR' or res.reason ~= 'failed' then return 'refused with ' .. tostring(res) end\n"
    "    return nil\n"
    "  end\n"
    "  if not valid then return 'a listing with an invalid name was accepted' end\n"
    "  if #res ~= #want then return 'the listing has ' .. #res .. ' entries for ' .. #want end\n"
    "  for i, e in ipairs(res) do\n"
    "    local w = want[i]\n"
    "    if e.name ~= w.name or e.type ~= w.type or e.size ~= w.size or e.modified ~= w.modified then\n"
    "      return 'entry ' .. i .. ' is not the one built'\n"
    "    end\n"
    "  end\n"
    "  return nil\n"
    "end\n";

static int check_ref = LUA_NOREF;

static void setup(lua_State *L) {
    if (check_ref != LUA_NOREF) return;
    if (luaL_loadbuffer(L, harness_lua, sizeof harness_lua - 1, "=listing_fuzz") != LUA_OK ||
        lua_pcall(L, 0, 1, 0) != LUA_OK)
        fz_fail("the harness does not load: %s", lua_tostring(L, -1));
    check_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    const char *why;
    setup(L);
    fz_cover_lua(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, check_ref);
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) fz_fail("the check raised: %s", fz_describe(L, -1));
    why = lua_tostring(L, -1);
    if (why != NULL) fz_fail("listing: %s", why);
    fz_end(L);
    return 0;
}
