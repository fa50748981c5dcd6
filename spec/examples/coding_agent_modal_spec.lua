-- examples/coding_agent.lua --provider modal: the coding-agent guide's recorded session on Modal
-- sandboxes, here the Modal stand-in (spec/npm/modal_stand_in.mjs: gRPC over bubblewrap containers)
-- run by this spec, with the example pointed at it by MODAL_SERVER_URL. The run's tests fail, then
-- pass, and the example's own re-check in a fresh sandbox passes; both sandboxes end.
local example = require('support.coding_agent_example')
local modal_stand_in = require('support.modal_stand_in')

local TOKEN_ID = 'ak-example0123456789'
local TOKEN_SECRET = 'as-example0123456789abcdefSECRET'

describe('examples/coding_agent.lua --provider modal', function()
  local stand

  setup(function()
    if modal_stand_in.available() then
      stand = modal_stand_in.start({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET })
    end
  end)
  teardown(function()
    if stand then stand:stop() end
  end)

  it('needs MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (exit code 2)', function()
    example.needs('modal', { MODAL_TOKEN_ID = TOKEN_ID }, 'MODAL_TOKEN_SECRET')
  end)

  it('plays the recorded session on the stand-in, and the re-check passes', function()
    if not stand then
      pending('@grpc/grpc-js is not installed (sh scripts/setup.sh installs spec/npm)')
      return
    end
    example.plays('modal', { MODAL_TOKEN_ID = TOKEN_ID, MODAL_TOKEN_SECRET = TOKEN_SECRET,
      MODAL_SERVER_URL = stand.url }, TOKEN_SECRET, 'no network')
    -- the run's sandbox and the re-check's, both ended at the end
    local made = stand:sandboxes()
    assert.are.equal(2, #made)
    for _, s in ipairs(made) do
      assert.are.equal('ended', s.state)
      assert.are.equal(2, s.definition.network_access.network_access_type)
    end
  end)
end)
