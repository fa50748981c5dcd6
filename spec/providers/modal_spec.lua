-- mayura.sandbox.modal is a documented refusal (Modal's API is gRPC only; see the module's
-- comment): the provider cannot be made, the error says why, and no token ends up in it.
local modal = require('mayura.sandbox.modal')

describe('modal_sandboxes', function()
  it('refuses with INVALID_CONFIG saying why, whatever the options, and shows no token', function()
    local secret = 'as-0123456789abcdefSECRET'
    for _, options in ipairs({ {}, { token_id = 'ak-0123456789', token_secret = secret }, nil }) do
      local err = assert.raises_code('INVALID_CONFIG', modal.modal_sandboxes, options)
      assert.truthy(err.message:find('gRPC', 1, true), err.message)
      assert.is_falsy(tostring(err):find(secret, 1, true))
    end
    assert.raises_code('INVALID_CONFIG', modal.modal_sandboxes, 'not a table')
  end)
end)
