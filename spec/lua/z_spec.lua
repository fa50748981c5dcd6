-- mayura.z: schemas that check values and render JSON Schema.
local z = require('mayura.z')
local mayura = require('mayura')
local core = require('mayura.core')

local json = core.json


-- The message of parsing `v` with `s`, which must fail.
local function problem(s, v)
  return assert.raises_code('INVALID_INPUT', s.parse, s, v).message
end

describe('mayura.z', function()
  describe('failure modes', function()
    it('refuses to build schemas from the wrong things with INVALID_CONFIG', function()
      assert.raises_code('INVALID_CONFIG', z.array, 'string')
      assert.raises_code('INVALID_CONFIG', z.object, 'x')
      assert.raises_code('INVALID_CONFIG', z.object, { a = 'string' })
      assert.raises_code('INVALID_CONFIG', z.object, { [1] = z.string() })
      assert.raises_code('INVALID_CONFIG', z.object, z.string())
      assert.raises_code('INVALID_CONFIG', z.enum, {})
      assert.raises_code('INVALID_CONFIG', z.enum, { 'a', true })
      assert.raises_code('INVALID_CONFIG', z.enum, 'a')
      assert.raises_code('INVALID_CONFIG', z.union, {})
      assert.raises_code('INVALID_CONFIG', z.union, { z.string(), 'x' })
      assert.raises_code('INVALID_CONFIG', z.literal, {})
      assert.raises_code('INVALID_CONFIG', z.literal, nil)
      assert.raises_code('INVALID_CONFIG', z.literal, 0 / 0)
      assert.raises_code('INVALID_CONFIG', z.optional, 'x')
      local s = z.string()
      assert.raises_code('INVALID_CONFIG', s.min, s, -1)
      assert.raises_code('INVALID_CONFIG', s.max, s, 1.5)
      assert.raises_code('INVALID_CONFIG', s.max, s, 'ten')
      assert.raises_code('INVALID_CONFIG', s.describe, s, 42)
      assert.raises_code('INVALID_CONFIG', s.strict, s)
      assert.raises_code('INVALID_CONFIG', s.default, s, 42)
      local b = z.boolean()
      assert.raises_code('INVALID_CONFIG', b.min, b, 1)
      assert.raises_code('INVALID_CONFIG', s.parse, 'not a schema', 1)
    end)

    it('names the path of the first problem, and lists every problem in issues', function()
      local s = z.object({
        summary = z.string(),
        files = z.array(z.object({ path = z.string(), content = z.string() })),
      })
      local err = assert.raises_code('INVALID_INPUT', s.parse, s, {
        summary = 'ok',
        files = { { path = 'a', content = 'x' }, { path = 3, content = 'y' }, { content = false } },
      })
      assert.are.equal('files[2].path: expected a string, got number', err.message)
      assert.are.equal('INVALID_INPUT: files[2].path: expected a string, got number', tostring(err))
      assert.are.equal(3, #err.issues)
      assert.are.same({ 'files', 2, 'path' }, err.issues[1].path)
      assert.are.equal('files[3].content', err.issues[2].where)
      assert.are.equal('files[3].path', err.issues[3].where)
      assert.are.equal('expected a string, got nil', err.issues[3].message)
    end)

    it('says what it got', function()
      assert.are.equal('expected a string, got nil', problem(z.string(), nil))
      assert.are.equal('expected a string, got null', problem(z.string(), json.null))
      assert.are.equal('expected a number, got string', problem(z.number(), '1'))
      assert.are.equal('expected a number, got NaN', problem(z.number(), 0 / 0))
      assert.matches('expected a number', problem(z.number(), math.huge))
      assert.are.equal('expected an integer, got 1.5', problem(z.integer(), 1.5))
      assert.are.equal('expected a boolean, got string', problem(z.boolean(), 'true'))
      assert.are.equal('expected an object, got an array', problem(z.object({}), { 1, 2 }))
      assert.are.equal('expected an array, got a table', problem(z.array(z.string()), { a = 1 }))
      assert.are.equal('expected an array, got an object', problem(z.array(z.string()), json.decode('{}')))
      assert.are.equal('expected "a", got "b"', problem(z.literal('a'), 'b'))
      assert.are.equal('expected 3, got string', problem(z.literal(3), '3'))
      assert.are.equal('expected one of "x", "y", got "z"', problem(z.enum({ 'x', 'y' }), 'z'))
      assert.are.equal('expected one of "x", "y", got boolean', problem(z.enum({ 'x', 'y' }), true))
      assert.are.equal('["a key"]: expected a string, got nil', problem(z.object({ ['a key'] = z.string() }), {}))
    end)

    it('checks min and max: characters of strings, items of arrays, values of numbers', function()
      assert.are.equal('expected at most 3 characters, got 4', problem(z.string():max(3), 'abcd'))
      assert.are.equal('expected at least 2 characters, got 1', problem(z.string():min(2), 'a'))
      -- UTF-8 characters, not bytes
      assert.are.equal('héé', z.string():max(3):parse('héé'))
      assert.matches('got 4', problem(z.string():max(3), 'éééé'))
      assert.are.equal('expected at least 1 item, got 0', problem(z.array(z.string()):min(1), {}))
      assert.are.equal('expected at most 2 items, got 3', problem(z.array(z.number()):max(2), { 1, 2, 3 }))
      assert.are.equal('expected a number at least 0, got -1', problem(z.number():min(0), -1))
      assert.are.equal('expected a number at most 10, got 10.5', problem(z.number():max(10), 10.5))
      assert.are.equal(10, z.integer():min(1):max(10):parse(10))
    end)

    it('refuses unknown keys of a strict object, and strips them otherwise', function()
      local s = z.object({ a = z.string() })
      assert.are.same({ a = 'x' }, s:parse({ a = 'x', b = 1, [1] = 2 }))
      assert.are.equal('unknown keys 1, b', problem(s:strict(), { a = 'x', b = 1, [1] = 2 }))
      assert.are.equal('unknown key b', problem(s:strict(), { a = 'x', b = 1 }))
    end)

    it('reports the union option that got furthest', function()
      local s = z.union({ z.string(), z.object({ kind = z.literal('file'), path = z.string() }) })
      assert.are.equal('expected a string or an object, got boolean', problem(s, true))
      assert.are.equal('path: expected a string, got number', problem(s, { kind = 'file', path = 1 }))
      assert.are.equal('x', s:parse('x'))
      assert.are.same({ kind = 'file', path = 'p' }, s:parse({ kind = 'file', path = 'p', extra = 1 }))
    end)

    it('safe_parse returns false and the issues instead of raising', function()
      local ok, issues, err = z.object({ n = z.integer() }):safe_parse({ n = 'x' })
      assert.is_false(ok)
      assert.are.equal(1, #issues)
      assert.are.equal('n', issues[1].where)
      assert.are.equal('INVALID_INPUT', err.code)
      local ok2, v = z.integer():safe_parse(4)
      assert.is_true(ok2)
      assert.are.equal(4, v)
    end)
  end)

  it('returns a checked copy, not the value given', function()
    local input = { files = { { path = 'a' } } }
    local out = z.object({ files = z.array(z.object({ path = z.string() })) }):parse(input)
    assert.are.same(input, out)
    assert.are_not.equal(input, out)
    assert.are_not.equal(input.files, out.files)
    out.files[1].path = 'changed'
    assert.are.equal('a', input.files[1].path)
  end)

  it('gives arrays that encode as JSON arrays, even empty', function()
    local out = z.object({ items = z.array(z.string()) }):parse({ items = {} })
    assert.are.equal('{"items":[]}', json.encode(out))
  end)

  it('treats nil and JSON null as absent for optional fields, and gives defaults', function()
    local s = z.object({
      a = z.string():optional(),
      b = z.optional(z.number()),
      c = z.integer():default(7),
      d = z.array(z.string()):default({ 'x' }),
    })
    assert.are.same({ c = 7, d = { 'x' } }, s:parse({}))
    assert.are.same({ c = 7, d = { 'x' } }, s:parse(json.decode('{"a":null,"b":null,"c":null}')))
    assert.are.same({ a = 'y', b = 2, c = 1, d = {} }, s:parse({ a = 'y', b = 2, c = 1, d = {} }))
    -- each default is a fresh copy
    local one, two = s:parse({}), s:parse({})
    assert.are_not.equal(one.d, two.d)
    assert.are.equal('expected a string, got null', problem(z.string(), json.null))
  end)

  it('checks values decoded from JSON', function()
    local s = z.object({ task = z.string(), n = z.integer(), tags = z.array(z.enum({ 'a', 'b' })) })
    local v = s:parse(json.decode('{"task":"t","n":3,"tags":["a","b"],"extra":{"x":1}}'))
    assert.are.same({ task = 't', n = 3, tags = { 'a', 'b' } }, v)
  end)

  it('leaves schemas unchanged by modifiers', function()
    local base = z.string()
    local short = base:max(2)
    assert.are.equal('abc', base:parse('abc'))
    assert.has_error(function() short:parse('abc') end)
    local opt = base:optional()
    assert.is_nil(opt:parse(nil))
    assert.has_error(function() base:parse(nil) end)
    assert.is_true(z.is_schema(short))
  end)

  it('any accepts anything', function()
    local t = {}
    assert.are.equal(t, z.any():parse(t))
    assert.is_nil(z.any():parse(nil))
  end)

  it('renders JSON Schema', function()
    local s = z.object({
      summary = z.string():max(2000):describe('What was done.'),
      files = z.array(z.object({ path = z.string():min(1):max(200), content = z.string() })):min(1):max(10),
      mode = z.enum({ 'fast', 'slow' }):optional(),
      count = z.integer():min(0):max(5):default(1),
      ratio = z.number(),
      kind = z.literal('result'),
      done = z.boolean(),
      either = z.union({ z.string(), z.integer() }),
    })
    local got = json.decode(json.encode(s:json_schema()))
    assert.are.same({
      type = 'object',
      additionalProperties = false,
      required = { 'done', 'either', 'files', 'kind', 'ratio', 'summary' },
      properties = {
        summary = { type = 'string', maxLength = 2000, description = 'What was done.' },
        files = {
          type = 'array', minItems = 1, maxItems = 10,
          items = {
            type = 'object', additionalProperties = false, required = { 'content', 'path' },
            properties = { path = { type = 'string', minLength = 1, maxLength = 200 }, content = { type = 'string' } },
          },
        },
        mode = { type = 'string', enum = { 'fast', 'slow' } },
        count = { type = 'integer', minimum = 0, maximum = 5, default = 1 },
        ratio = { type = 'number' },
        kind = { type = 'string', const = 'result' },
        done = { type = 'boolean' },
        either = { anyOf = { { type = 'string' }, { type = 'integer' } } },
      },
    }, got)
    local empty = json.encode(z.object({}):json_schema())
    assert.matches('"properties":{}', empty, 1, true)
    assert.matches('"required":[]', empty, 1, true)
    -- a fresh table each call
    assert.are_not.equal(s:json_schema(), s:json_schema())
  end)

  it('is mayura.z', function()
    assert.are.equal(z, mayura.z)
  end)
end)
