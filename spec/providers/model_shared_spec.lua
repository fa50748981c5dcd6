-- mayura.provider._shared's arithmetic, which every model adapter counts on:
-- the backoff between attempts, the cost in whole micro-dollars and the
-- reading of retry-after. What the adapters do with it is the contract of
-- spec/support/model_contract.lua.
local shared = require('mayura.provider._shared')

describe('mayura.provider._shared', function()
  it('backoff doubles from retry_base_ms, with jitter, up to 8 s', function()
    for n = 0, 6 do
      local d = shared.backoff_ms(500, n)
      local full = math.min(500 * 2 ^ n, 8000)
      assert.is_true(d >= math.floor(full * 0.75) and d <= full, tostring(d))
    end
  end)

  it('computes costs exactly, as integers', function()
    assert.are.equal(0, shared.cost_micros({}))
    assert.are.equal(1, shared.cost_micros({ { 1, 1 } }))
    assert.are.equal(1000000, shared.cost_micros({ { 1000000, 1000000 } }))
    assert.are.equal(1000001, shared.cost_micros({ { 1000001, 1000000 } }))
    assert.are.equal(3, shared.cost_micros({ { 1, 2000000, 25 } }))   -- 2.5 up to 3
    assert.is_true(math.type == nil or math.type(shared.cost_micros({ { 7, 3 } })) == 'integer')
  end)

  it('reads retry-after as seconds, milliseconds or an HTTP date', function()
    local now = shared.http_date('Wed, 21 Oct 2015 07:28:00 GMT')
    assert.are.equal(1445412480, now)
    assert.are.equal(3000, shared.retry_after_ms({ ['retry-after'] = '3' }, now))
    assert.are.equal(1500, shared.retry_after_ms({ ['retry-after'] = '1.5' }, now))
    assert.are.equal(250, shared.retry_after_ms({ ['retry-after-ms'] = '250', ['retry-after'] = '9' }, now))
    assert.are.equal(7000, shared.retry_after_ms({ ['retry-after'] = 'Wed, 21 Oct 2015 07:28:07 GMT' }, now))
    assert.are.equal(0, shared.retry_after_ms({ ['retry-after'] = 'Wed, 21 Oct 2015 07:27:00 GMT' }, now))
    assert.are.equal(86400000, shared.retry_after_ms({ ['retry-after'] = 'Thu, 22 Oct 2015 07:28:00 GMT' }, now))
    assert.are.equal(951782400, shared.http_date('Tue, 29 Feb 2000 00:00:00 GMT'))
    assert.is_nil(shared.retry_after_ms({ ['retry-after'] = 'soon' }, now))
    assert.is_nil(shared.retry_after_ms({ ['retry-after'] = '-3' }, now))
    assert.is_nil(shared.retry_after_ms({}, now))
    assert.is_nil(shared.http_date('Wed, 21 Foo 2015 07:28:00 GMT'))
  end)
end)
