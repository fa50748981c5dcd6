-- mayura.sandbox.provider(name, options): providers found by name. Each of mayura's providers is
-- its module's `sandboxes`, the very function of its own `<name>_sandboxes`; a name of another shape,
-- of no module, or of a module of the namespace that is not a provider is INVALID_INPUT and loads
-- nothing; a provider module the list does not know is found by its name all the same.
local sandbox = require('mayura.sandbox')
local util = require('support.util')

local U = 'http://127.0.0.1:9'
-- Options each provider takes without a word to its service (or, with { check = true }, to the host).
local OPTIONS = {
  agentcore = { region = 'eu-west-1', endpoint = U, credentials = { access_key_id = 'a', secret_access_key = 's' } },
  apple_container = {},
  cloudflare = { worker_url = U, api_key = 'k' },
  codesandbox = { token = 't', base_url = U },
  daytona = { api_key = 'k', base_url = U },
  docker = { image = 'alpine:3' },
  e2b = { api_key = 'k', api_url = U },
  e2b_desktop = { api_key = 'k', api_url = U },
  fly = { token = 't', app = 'a', base_url = U },
  kubernetes = { server = U, token = 't', agent_image = 'mayura/agent:1' },
  ['local'] = {},
  modal = { token_id = 'a', token_secret = 'b', server_url = U },
  northflank = { token = 't', project_id = 'p', api_url = U, exec_url = U },
  railway = { token = 't', environment_id = 'e', endpoint = U .. '/graphql/v2', ws_url = 'ws://127.0.0.1:9/ws' },
  vercel = { token = 't', team_id = 'x', project_id = 'p', base_url = U },
}
local CHECK = { check = true }

local function loaded_names()
  local out = {}
  for k in pairs(package.loaded) do out[k] = true end
  return out
end

-- The modules loaded since `before`.
local function new_modules(before)
  local out = {}
  for k in pairs(package.loaded) do if not before[k] then out[#out + 1] = k end end
  table.sort(out)
  return out
end

local function refused(name, ...)
  local before = loaded_names()
  local ok, err = pcall(sandbox.provider, name, ...)
  assert.is_false(ok, tostring(name))
  assert.are.equal('INVALID_INPUT', type(err) == 'table' and err.code, tostring(err))
  assert.are.equal(name, err.unknown_provider)
  assert.are.same({}, new_modules(before))
  return err
end

describe('mayura.sandbox.provider', function()
  it('lists the providers mayura ships, sorted, in a new list each time', function()
    local names = sandbox.providers()
    local want = {}
    for name in pairs(OPTIONS) do want[#want + 1] = name end
    table.sort(want)
    assert.are.same(want, names)
    names[1] = 'changed'
    assert.are.equal(want[1], sandbox.providers()[1])
  end)

  it("finds each by name: its module's sandboxes, the same function as its <name>_sandboxes", function()
    for _, name in ipairs(sandbox.providers()) do
      local mod = require('mayura.sandbox.' .. name)
      assert.are.equal('function', type(mod[name .. '_sandboxes']), name)
      assert.are.equal(mod[name .. '_sandboxes'], mod.sandboxes, name)
      local by_name = sandbox.provider(name, OPTIONS[name], CHECK)
      local direct = mod[name .. '_sandboxes'](OPTIONS[name], CHECK)
      assert.are.equal(direct.id, by_name.id, name)
      assert.are.same(direct.features, by_name.features, name)
      assert.are.equal(direct.max_lifetime_ms, by_name.max_lifetime_ms, name)
    end
  end)

  it("passes the options on: the provider's own checks answer as they do called directly", function()
    local ok, err = pcall(sandbox.provider, 'fly', { app = 'a' })
    assert.is_false(ok)
    assert.are.equal('INVALID_CONFIG', err.code)
    assert.is_nil(err.unknown_provider)
    local direct_ok, direct = pcall(require('mayura.sandbox.fly').fly_sandboxes, { app = 'a' })
    assert.is_false(direct_ok)
    assert.are.equal(direct.message, err.message)
  end)

  it('refuses a name of another shape with INVALID_INPUT, loading nothing', function()
    for _, name in ipairs({ '../x', 'Docker', '', 'a.b', 'mayura.sandbox.local', '_host', '_egress', 'local/..',
      'apple-container', ' local', 'local\0', '9lives', string.rep('a', 65) }) do
      local err = refused(name)
      assert.truthy(err.message:find('is not valid', 1, true), err.message)
    end
    refused(nil)
    refused(42)
    refused({})
  end)

  it('refuses a well-formed name of no module, and the namespace\'s own modules, loading nothing', function()
    local err = refused('nowhere')
    assert.truthy(err.message:find("unknown provider 'nowhere'", 1, true), err.message)
    assert.truthy(err.message:find('docker', 1, true), err.message)   -- and says which there are
    for _, name in ipairs({ 'init', 'command', 'per_run', 'scripts', 'testing', 'tools' }) do
      err = refused(name)
      assert.truthy(err.message:find('is not a provider', 1, true), err.message)
    end
  end)

  describe('a provider module mayura does not list', function()
    local dir, saved_path
    local PROBES = { 'registry_probe', 'registry_probe_plain', 'registry_probe_broken' }

    setup(function()
      dir = util.tmpdir()
      assert(os.execute('mkdir -p ' .. dir .. '/mayura/sandbox'))
      local function module(name, text)
        local f = assert(io.open(dir .. '/mayura/sandbox/' .. name .. '.lua', 'w'))
        f:write(text)
        f:close()
      end
      module('registry_probe', [[
local M = {}
function M.registry_probe_sandboxes(options, how)
  return { id = 'probe', options = options, how = how }
end
M.sandboxes = M.registry_probe_sandboxes
return M
]])
      module('registry_probe_plain', 'return { helper = function() end }\n')
      module('registry_probe_broken', "error('the probe fails as it loads', 0)\n")
      saved_path = package.path
      package.path = dir .. '/?.lua;' .. package.path
    end)

    teardown(function()
      package.path = saved_path
      for _, name in ipairs(PROBES) do package.loaded['mayura.sandbox.' .. name] = nil end
      util.rmdir(dir)
    end)

    it('is found by its name when it exports sandboxes, options and all', function()
      local options, how = { size = 1 }, { check = true }
      local p = sandbox.provider('registry_probe', options, how)
      assert.are.equal('probe', p.id)
      assert.are.equal(options, p.options)
      assert.are.equal(how, p.how)
    end)

    it('is refused with INVALID_INPUT when it exports no sandboxes', function()
      local ok, err = pcall(sandbox.provider, 'registry_probe_plain')
      assert.is_false(ok)
      assert.are.equal('INVALID_INPUT', err.code)
      assert.are.equal('registry_probe_plain', err.unknown_provider)
      assert.truthy(err.message:find('is not a provider', 1, true), err.message)
    end)

    it('fails as itself when it raises as it loads (not taken for an unknown name)', function()
      local ok, err = pcall(sandbox.provider, 'registry_probe_broken')
      assert.is_false(ok)
      assert.are.equal('the probe fails as it loads', err)
    end)
  end)
end)
