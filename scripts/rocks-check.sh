#!/bin/sh
# rocks-check.sh: `luarocks make` from a clean clone of this checkout's HEAD, for Lua 5.4 and for
# LuaJIT (the 5.1 ABI), each into a tree of its own; then, in each interpreter, with only that tree
# on its paths, loads mayura and runs a command in a local sandbox. Exits non-zero on any failure.
# Dependencies come from Debian's packages (lua-luv), so luarocks is told not to fetch them.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$here" "$work/src"
cat > "$work/try.lua" <<'LUA'
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local out
require('mayura').run(function()
  local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(),
    { max_sandboxes = 1, max_lifetime_ms = 30000 })
  local ok, err = pcall(function()
    local s = pool:create({ lifetime_ms = 20000 })
    out = s:exec({ 'echo', 'from a rock' }).stdout
  end)
  pool:close()
  if not ok then error(err, 0) end
end)
assert(out == 'from a rock\n', 'unexpected output: ' .. tostring(out))
print(('rocks-check: %s: a sandbox ran a command'):format(rawget(_G, 'jit') and jit.version or _VERSION))
LUA
check() { # lua-version interpreter
    tree="$work/tree-$1"
    (cd "$work/src" && luarocks --lua-version "$1" --tree "$tree" make --deps-mode=none >"$work/log-$1" 2>&1) || {
        cat "$work/log-$1" >&2; echo "rocks-check: luarocks make for Lua $1 failed" >&2; exit 1; }
    # the tree's paths alone, then the system's (luv comes from Debian's package)
    lp=$(luarocks --lua-version "$1" --tree "$tree" path --lr-path)
    lc=$(luarocks --lua-version "$1" --tree "$tree" path --lr-cpath)
    (cd "$work" && LUA_PATH="$lp;;" LUA_CPATH="$lc;;" "$2" try.lua)
}
check 5.4 lua5.4
check 5.1 luajit
