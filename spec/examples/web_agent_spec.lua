-- examples/web_agent.lua, the network allow-list end to end, run as a user would: a subprocess of
-- build/mayura playing the recorded session against a real sandbox with an allow-list (local, and
-- Docker when it is here); the package comes through the proxy from the registry stand-in, a name
-- off the list is refused (and printed from the pool's on_event), and the page served on port
-- 8080 is read back through url.
local process = require('mayura.process')
local providers = require('support.providers')

local HOST = require('support.compat').host

local function run(args)
  local argv = { HOST, 'examples/web_agent.lua' }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return process.run(argv, { env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME') }, timeout_ms = 120000 })
end

describe('examples/web_agent.lua', function()
  it('refuses unknown arguments with exit code 2', function()
    local r = run({ '--provider', 'nowhere' })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stderr:find('usage:', 1, true))
  end)

  local kinds = {}
  for _, p in ipairs(providers.list()) do kinds[p.kind] = true end
  for _, kind in ipairs({ 'local', 'docker' }) do
    it('installs through the allow-list, is refused a mirror, and serves the page it reads back (' .. kind .. ')',
      function()
        if not kinds[kind] then return pending('no ' .. kind .. ' provider here') end
        local r = run({ '--provider', kind })
        if r.exit_code == 2 and r.stderr:find('no network allow-list', 1, true) then
          return pending('the ' .. kind .. ' provider offers no allow-list here (not root)')
        end
        local all = r.stdout .. r.stderr
        assert.are.equal(0, r.exit_code, all)
        assert.truthy(r.stdout:find('greet%-1%.0%.0%.tgz[^\n]*\n%s*%-> exit 0'), all)
        assert.truthy(r.stdout:find('refused mirror.example.net:80 (not_allowed)', 1, true), all)
        assert.truthy(r.stdout:find('\nRead back: Hello, visitor!\n', 1, true), all)
        assert.truthy(r.stdout:find('(1 download from the registry, 1 refusal)', 1, true), all)
      end)
  end
end)
