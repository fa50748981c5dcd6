-- The handle recipe of the core (core/mc.h): every userdata class is registered one way, with
-- __gc and __close the same function, __tostring, __index and __name; closing a handle twice and
-- then collecting it is safe, for a handle left empty (made, its resource not) and for a live one.
local core = require('mayura.core')
local task = require('mayura._task')

-- The metatables of tables, not of userdata: data marks, not handles.
local DATA = { ['mayura.error'] = true, ['mayura.json.array'] = true, ['mayura.json.object'] = true,
  ['mayura.msgpack.bin'] = true }

-- Every metatable the core put in the registry: a table under a 'mayura.' name with a metamethod.
local function core_metatables()
  local found = {}
  for name, mt in pairs(debug.getregistry()) do
    if type(name) == 'string' and name:match('^mayura%.') and type(mt) == 'table' then
      for k in pairs(mt) do
        if type(k) == 'string' and k:sub(1, 2) == '__' then found[name] = mt break end
      end
    end
  end
  return found
end

local function close_twice(h)
  local mt = getmetatable(h)
  mt.__close(h, nil)
  mt.__close(h, nil)
  mt.__gc(h)
end

describe('the handles of the core', function()
  it('every userdata class has __gc, __close equal to it, __tostring, __index and __name', function()
    local classes = debug.getregistry()['mayura.core.classes']
    assert.are.equal('table', type(classes))
    local names = {}
    for name, mt in pairs(core_metatables()) do
      if not DATA[name] then
        names[#names + 1] = name
        assert.are.equal('function', type(rawget(mt, '__gc')), name)
        assert.is_true(rawequal(rawget(mt, '__gc'), rawget(mt, '__close')), name)
        assert.are.equal('function', type(rawget(mt, '__tostring')), name)
        assert.are.equal('table', type(rawget(mt, '__index')), name)
        assert.are.equal(name, rawget(mt, '__name'))
        assert.is_not_nil(classes[name], name .. ' was not registered as a class')
      end
    end
    for name in pairs(classes) do
      assert.is_not_nil(core_metatables()[name], name)
    end
    table.sort(names)
    -- not vacuous: the classes of the core are all there
    assert.are.same({ 'mayura.channel', 'mayura.core.prepared', 'mayura.http_multi', 'mayura.http_request', 'mayura.json.box',
      'mayura.msgpack.box', 'mayura.process', 'mayura.proto_hold', 'mayura.relay', 'mayura.stream_parser',
      'mayura.ws', 'mayura.ws_state' }, names)
  end)

  it('an empty handle of every class prints, closes twice and is collected', function()
    for name in pairs(debug.getregistry()['mayura.core.classes']) do
      local h = core._handle(name)
      assert.are.equal('userdata', type(h))
      assert.are.equal(name, tostring(h):sub(1, #name))
      close_twice(h)
      assert.are.equal(name, tostring(h):sub(1, #name))
    end
    collectgarbage()
    collectgarbage()
    local ok, err = pcall(core._handle, 'mayura.error')
    assert.is_false(ok)
    assert.are.equal('INVALID_INPUT', err.code)
  end)

  it('a live handle of every public class closes twice, then is collected, and nothing calls back', function()
    local calls = 0
    task.run(function()
      local function cb() calls = calls + 1 end
      local p = assert(core.spawn({ argv = { 'sleep', '30' } }, cb))
      local a, b = core.socketpair()
      local ch = core.channel(a, { on_close = cb })
      local c, d = core.socketpair()
      local relay = core.relay(b, c, nil, cb)
      local parser = core.stream_parser('sse')
      parser:feed('data: x\n')
      local req = core.http.request({ url = 'http://127.0.0.1:9/' }, cb)
      local ws = core.ws_connect({ url = 'ws://127.0.0.1:9/' }, function() end)
      for _, h in ipairs({ p, ch, relay, parser, req, ws }) do
        close_twice(h)
        assert.is_string(tostring(h))
      end
      assert.is_false(p:running())
      assert.is_true(ch:is_closed())
      assert.matches('finished', tostring(relay))
      core.close_fd(b)
      core.close_fd(c)
      core.close_fd(d)
      task.sleep(100)
    end)
    collectgarbage()
    collectgarbage()
    assert.are.equal(0, calls)
  end)
end)
