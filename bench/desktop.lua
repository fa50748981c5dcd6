--- Benchmark of the desktop of the local and Docker providers, not a test: medians and ratios
-- measured in one run.
--
--   build/mayura bench/desktop.lua [N]
--
-- create+release of a sandbox with `desktop = true` against one without (the X server's start and
-- end), on the local provider and, when a daemon answers and mayura-test/desktop:1 is there
-- (scripts/docker-setup.sh), on Docker; and each desktop action on a 1024x768 screen against an
-- exec of `true` in the same sandbox (an action is one command through the agent).
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local process = require('mayura.process')

local N = tonumber(arg and arg[1]) or 40
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')
local function measure(fn, n) return bench.measure(n or N, fn, 2) end

local DESKTOP_IMAGE = 'mayura-test/desktop:1'

local results, ratios = {}, {}
local function add(name, ms) results[#results + 1] = { name, ms } end
local function ratio(name, x) ratios[#ratios + 1] = { name, x } end

local function run(name, provider)
  if not provider.features.desktop then
    print(name .. ': no desktop here (scripts/setup.sh, scripts/docker-setup.sh)')
    return
  end
  local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000 })
  local plain = measure(function() pool:create({ lifetime_ms = 60000 }):release() end)
  local with = measure(function() pool:create({ lifetime_ms = 60000, desktop = true }):release() end)
  add(name .. ' create+release', plain)
  add(name .. ' create+release, desktop = true', with)
  ratio(name .. ' create+release desktop / none', with / plain)

  local sb = pool:create({ lifetime_ms = 600000, desktop = true })
  local d = sb.desktop
  local exec = measure(function() assert(sb:exec({ 'true' }).exit_code == 0) end, N * 2)
  add(name .. ' exec true', exec)
  local actions = {
    { 'screenshot (1024x768)', function() d:screenshot() end },
    { 'click', function() d:click({ x = 10, y = 10 }) end },
    { 'type 10 characters', function() d:type('abcdefghij') end },
    { 'key', function() d:key('Escape') end },
    { 'size', function() d:size() end },
  }
  for _, a in ipairs(actions) do
    local ms = measure(a[2])
    add(name .. ' desktop ' .. a[1], ms)
    ratio(name .. ' ' .. a[1] .. ' / exec true', ms / exec)
  end
  sb:release()
  pool:close()
end

run('local', local_provider.local_sandboxes({ memory_mib = 256 }))
local probe = process.run({ 'sh', '-c', 'docker info >/dev/null 2>&1 && docker image inspect ' .. DESKTOP_IMAGE })
if probe.exit_code == 0 then
  local docker = require('mayura.sandbox.docker')
  run('docker', docker.docker_sandboxes({ image = DESKTOP_IMAGE, desktop = true, memory_mib = 256 }))
else
  print('docker: no daemon or no ' .. DESKTOP_IMAGE .. ' (scripts/docker-setup.sh)')
end

print(('%-54s %10s'):format('operation (median)', 'ms'))
for _, r in ipairs(results) do print(('%-54s %10.3f'):format(r[1], r[2])) end
print()
for _, r in ipairs(ratios) do print(('%-54s %8.2fx'):format(r[1], r[2])) end
