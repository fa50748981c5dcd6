--- mayura.z: schemas for agent inputs, outputs and tool inputs, in the shape of zod.
--
--   local z = require('mayura').z
--   local task = z.object({ task = z.string():max(4000) })
--   local value = task:parse({ task = 'Print 2 + 3.' })   -- a checked copy, or raises INVALID_INPUT
--   local ok, value_or_issues = task:safe_parse(input)
--   local schema = task:json_schema()                      -- JSON Schema, for model tool definitions
--
-- Builders: z.string(), z.number(), z.integer(), z.boolean(), z.literal(v),
-- z.enum{ 'a', 'b' }, z.array(s), z.object{ field = s, ... }, z.optional(s),
-- z.union{ s1, s2 }, z.any(). Every schema is immutable: a modifier returns a
-- new schema. Modifiers: `:optional()`, `:default(v)`, `:describe(text)`,
-- `:min(n)` / `:max(n)` (characters of a string, items of an array, the value
-- of a number), `:strict()` on objects.
--
-- Lua notes, where zod's JavaScript meaning does not carry over:
--   * string lengths count UTF-8 characters (the bytes that do not continue a
--     character), not bytes; a string is not checked for being valid UTF-8;
--   * an array is a Lua sequence (keys exactly 1..n; `{}` is an empty array);
--     arrays in results carry `core.json.array_mt`, so an empty one encodes as `[]`;
--   * an object is a table with string keys; unknown keys are left out of the
--     result, or refused with `:strict()`; its fields are checked in the order
--     of their names, so "the first problem" is always the same one;
--   * JSON null (`core.json.null`) counts as absent for an optional field, and
--     is refused elsewhere; numbers must be finite;
--   * paths in messages use Lua indexes: `files[1].path` is the first file;
--   * a mistake in building a schema raises INVALID_CONFIG; a value that does
--     not match raises INVALID_INPUT whose message starts with the path of the
--     first problem and whose `issues` lists them (`{ path, where, message }`).
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')

local M = {}

local json_null = core.json.null
local array_mt = core.json.array_mt
local object_mt = core.json.object_mt

local MAX_ISSUES = 50

-- The methods of schemas, and their metatable. Every user of this module shares them (a policy
-- file among them), so neither can be reached or changed through a schema or the module: the
-- metatable is hidden behind `__metatable`, the methods have no `__index` a schema could name, and
-- a key cannot be added to a schema.
local Schema = {}
local schema_mt = {
  __index = Schema,
  __newindex = function() error('a schema cannot be changed: its modifiers return new ones', 2) end,
}
local SCHEMA_TAG = setmetatable({}, {
  __newindex = function() error('a schema cannot be changed', 2) end, __metatable = false,
})
schema_mt.__metatable = SCHEMA_TAG

local function config_error(message)
  errors.raise('INVALID_CONFIG', message, nil, 3)
end

local function new(kind, fields)
  fields.kind = kind
  return setmetatable(fields, schema_mt)
end

--- Whether `v` is a schema of this module.
function M.is_schema(v)
  return getmetatable(v) == SCHEMA_TAG
end

-- A shallow copy of a schema with `k = v` set.
local function with(self, k, v)
  local copy = {}
  for key, val in pairs(self) do copy[key] = val end
  copy[k] = v
  copy._json = nil
  return setmetatable(copy, schema_mt)
end

-- {======================================================
-- Values
-- =======================================================

-- The number of UTF-8 characters of `s`: the bytes that do not continue one.
local function char_count(s)
  if not s:find('[\128-\255]') then return #s end
  local _, n = s:gsub('[^\128-\191]', '')
  return n
end

-- Whether `t` is a Lua sequence (keys exactly 1..n).
local function is_sequence(t)
  local n = #t
  local count = 0
  for k in pairs(t) do
    if not check.is_int(k) or k < 1 or k > n then return false end
    count = count + 1
  end
  return count == n
end

-- What a value is, as a message says it.
local function type_name(v)
  if v == nil then return 'nil' end
  if v == json_null then return 'null' end
  local t = type(v)
  if t == 'table' then
    local mt = getmetatable(v)
    if mt == array_mt then return 'an array' end
    if mt == object_mt then return 'an object' end
    if next(v) == nil then return 'an empty table' end
    if is_sequence(v) then return 'an array' end
    return 'a table'
  end
  if t == 'number' and v ~= v then return 'NaN' end
  return t
end

local function show(v)
  if type(v) == 'string' then return string.format('%q', v) end
  return tostring(v)
end

local function deep_copy(v, seen)
  if type(v) ~= 'table' then return v end
  seen = seen or {}
  if seen[v] then return seen[v] end
  local out = {}
  seen[v] = out
  for k, x in pairs(v) do out[deep_copy(k, seen)] = deep_copy(x, seen) end
  return setmetatable(out, getmetatable(v))
end

-- }======================================================

-- {======================================================
-- Checking
-- =======================================================

-- A check context: the path to the value being checked and the issues found.
-- `path` is a stack shared while walking; an issue copies it.

local function where_of(path)
  local parts = {}
  for i, k in ipairs(path) do
    if type(k) == 'number' then
      parts[#parts + 1] = '[' .. k .. ']'
    elseif type(k) == 'string' and k:match('^[%a_][%w_]*$') then
      parts[#parts + 1] = (i == 1 and '' or '.') .. k
    else
      parts[#parts + 1] = '[' .. string.format('%q', tostring(k)) .. ']'
    end
  end
  return table.concat(parts)
end

local function issue(cx, message)
  local n = #cx.issues
  if n >= MAX_ISSUES then
    cx.more = true
    return
  end
  local path = {}
  for i = 1, cx.depth do path[i] = cx.path[i] end
  cx.issues[n + 1] = { path = path, where = where_of(path), message = message }
end

local checkers = {}

-- Checks `v` against schema `s`; returns the checked value (nil after an issue).
local function run(s, v, cx)
  if v == nil or v == json_null then
    if s.has_default then return deep_copy(s.default) end
    if s.is_optional then return nil end
    if s.kind == 'any' then return v end
  end
  return checkers[s.kind](s, v, cx)
end

local function expected(s)
  return s:_expected()
end

local function type_issue(s, v, cx)
  issue(cx, 'expected ' .. expected(s) .. ', got ' .. type_name(v))
end

local function bounds(s, n, cx, unit_one, unit_many)
  if s.min_value ~= nil and n < s.min_value then
    if unit_one then
      issue(cx, 'expected at least ' .. s.min_value .. ' ' .. (s.min_value == 1 and unit_one or unit_many)
        .. ', got ' .. n)
    else
      issue(cx, 'expected a number at least ' .. s.min_value .. ', got ' .. n)
    end
    return false
  end
  if s.max_value ~= nil and n > s.max_value then
    if unit_one then
      issue(cx, 'expected at most ' .. s.max_value .. ' ' .. (s.max_value == 1 and unit_one or unit_many)
        .. ', got ' .. n)
    else
      issue(cx, 'expected a number at most ' .. s.max_value .. ', got ' .. n)
    end
    return false
  end
  return true
end

function checkers.string(s, v, cx)
  if type(v) ~= 'string' then return type_issue(s, v, cx) end
  if (s.min_value or s.max_value) and not bounds(s, char_count(v), cx, 'character', 'characters') then
    return nil
  end
  return v
end

function checkers.number(s, v, cx)
  if type(v) ~= 'number' or v ~= v or v == math.huge or v == -math.huge then return type_issue(s, v, cx) end
  if s.integer and not check.is_int(v) then
    issue(cx, 'expected an integer, got ' .. tostring(v))
    return nil
  end
  if not bounds(s, v, cx) then return nil end
  if s.integer and math.tointeger then return math.tointeger(v) end
  return v
end

function checkers.boolean(s, v, cx)
  if type(v) ~= 'boolean' then return type_issue(s, v, cx) end
  return v
end

function checkers.literal(s, v, cx)
  if v ~= s.value then
    issue(cx, 'expected ' .. show(s.value) .. ', got ' .. (type(v) == type(s.value) and show(v) or type_name(v)))
    return nil
  end
  return v
end

function checkers.enum(s, v, cx)
  if s.set[v] then return v end
  if type(v) == 'string' or type(v) == 'number' then
    issue(cx, 'expected ' .. expected(s) .. ', got ' .. show(v))
  else
    type_issue(s, v, cx)
  end
  return nil
end

function checkers.any(_, v)
  return v
end

function checkers.array(s, v, cx)
  if type(v) ~= 'table' or getmetatable(v) == object_mt or not is_sequence(v) then
    return type_issue(s, v, cx)
  end
  local n = #v
  if not bounds(s, n, cx, 'item', 'items') then return nil end
  local out = setmetatable({}, array_mt)
  local before = #cx.issues
  local depth = cx.depth + 1
  local item = s.item
  for i = 1, n do
    cx.depth = depth
    cx.path[depth] = i
    local r = run(item, v[i], cx)
    if r == nil then r = json_null end
    out[i] = r
    if cx.more then break end
  end
  cx.depth = depth - 1
  if #cx.issues > before then return nil end
  return out
end

function checkers.object(s, v, cx)
  if type(v) ~= 'table' or getmetatable(v) == array_mt
    or (#v > 0 and getmetatable(v) ~= object_mt and is_sequence(v)) then
    return type_issue(s, v, cx)
  end
  local out = {}
  local before = #cx.issues
  local depth = cx.depth + 1
  local shape = s.shape
  for _, key in ipairs(s.keys) do
    cx.depth = depth
    cx.path[depth] = key
    out[key] = run(shape[key], v[key], cx)
    if cx.more then break end
  end
  cx.depth = depth - 1
  if s.strict_keys and not cx.more then
    local unknown = {}
    for k in pairs(v) do
      if type(k) ~= 'string' or shape[k] == nil then unknown[#unknown + 1] = tostring(k) end
    end
    if #unknown > 0 then
      table.sort(unknown)
      issue(cx, 'unknown key' .. (#unknown > 1 and 's ' or ' ') .. table.concat(unknown, ', '))
    end
  end
  if #cx.issues > before then return nil end
  return out
end

-- The option that got furthest: its first issue has the longest path.
local function furthest(results)
  local best, best_len = nil, -1
  for _, r in ipairs(results) do
    local first = r[1]
    if first and #first.path > best_len then
      best, best_len = r, #first.path
    end
  end
  return best, best_len
end

function checkers.union(s, v, cx)
  local results = {}
  for i, option in ipairs(s.options) do
    local sub = { path = {}, depth = cx.depth, issues = {} }
    for d = 1, cx.depth do sub.path[d] = cx.path[d] end
    local r = run(option, v, sub)
    if #sub.issues == 0 then return r end
    results[i] = sub.issues
  end
  local best, len = furthest(results)
  if best and len > cx.depth then
    for _, iss in ipairs(best) do
      if #cx.issues >= MAX_ISSUES then cx.more = true break end
      cx.issues[#cx.issues + 1] = iss
    end
  else
    type_issue(s, v, cx)
  end
  return nil
end

-- }======================================================

-- {======================================================
-- Descriptions of what is expected
-- =======================================================

function Schema:_expected()
  local k = self.kind
  if k == 'string' then return 'a string' end
  if k == 'number' then return self.integer and 'an integer' or 'a number' end
  if k == 'boolean' then return 'a boolean' end
  if k == 'literal' then return show(self.value) end
  if k == 'enum' then
    local shown = {}
    for i, v in ipairs(self.values) do shown[i] = show(v) end
    return 'one of ' .. table.concat(shown, ', ')
  end
  if k == 'array' then return 'an array' end
  if k == 'object' then return 'an object' end
  if k == 'union' then
    local parts = {}
    for i, o in ipairs(self.options) do parts[i] = o:_expected() end
    return table.concat(parts, ' or ')
  end
  return 'a value'
end

-- }======================================================

-- {======================================================
-- Builders
-- =======================================================

--- A string.
function M.string() return new('string', {}) end

--- A finite number.
function M.number() return new('number', {}) end

--- A whole number.
function M.integer() return new('number', { integer = true }) end

--- true or false.
function M.boolean() return new('boolean', {}) end

--- Anything, as given (not copied); nil included.
function M.any() return new('any', {}) end

--- Exactly `v` (a string, number or boolean).
function M.literal(v)
  local t = type(v)
  if t ~= 'string' and t ~= 'boolean' and (t ~= 'number' or v ~= v) then
    config_error('z.literal expects a string, a number or a boolean')
  end
  return new('literal', { value = v })
end

--- One of the strings (or numbers) listed.
function M.enum(values)
  if type(values) ~= 'table' or #values == 0 or not is_sequence(values) then
    config_error('z.enum expects a non-empty list of strings')
  end
  local list, set = {}, {}
  for i, v in ipairs(values) do
    if type(v) ~= 'string' and type(v) ~= 'number' then
      config_error('z.enum values must be strings or numbers (value ' .. i .. ' is ' .. type(v) .. ')')
    end
    list[i] = v
    set[v] = true
  end
  return new('enum', { values = list, set = set })
end

--- A list whose items all match `item`.
function M.array(item)
  if not M.is_schema(item) then config_error('z.array expects a schema') end
  return new('array', { item = item })
end

--- A table with the named fields.
function M.object(shape)
  if type(shape) ~= 'table' or M.is_schema(shape) then
    config_error('z.object expects a table of field = schema')
  end
  local copy, keys = {}, {}
  for k, s in pairs(shape) do
    if type(k) ~= 'string' or k == '' then config_error('z.object field names must be non-empty strings') end
    if not M.is_schema(s) then config_error('z.object field ' .. k .. ' is not a schema') end
    copy[k] = s
    keys[#keys + 1] = k
  end
  table.sort(keys)
  return new('object', { shape = copy, keys = keys })
end

--- A value matching the first of the options that matches.
function M.union(options)
  if type(options) ~= 'table' or #options == 0 or not is_sequence(options) then
    config_error('z.union expects a non-empty list of schemas')
  end
  local list = {}
  for i, s in ipairs(options) do
    if not M.is_schema(s) then config_error('z.union option ' .. i .. ' is not a schema') end
    list[i] = s
  end
  return new('union', { options = list })
end

--- `s` or nothing.
function M.optional(s)
  if not M.is_schema(s) then config_error('z.optional expects a schema') end
  return s:optional()
end

-- }======================================================

-- {======================================================
-- Modifiers
-- =======================================================

--- The same schema, also accepting nothing (nil, or JSON null).
function Schema:optional()
  return with(self, 'is_optional', true)
end

--- The same schema, giving a copy of `v` when the value is absent. `v` must match.
function Schema:default(v)
  if v == nil then config_error('default expects a value') end
  local ok, res = self:safe_parse(v)
  if not ok then config_error('the default does not match its schema: ' .. res[1].message) end
  local s = with(self, 'has_default', true)
  rawset(s, 'default', res)
  return s
end

--- The same schema, with a description the model sees.
function Schema:describe(text)
  if type(text) ~= 'string' then config_error('describe expects a string') end
  return with(self, 'description', text)
end

local function bound(self, which, n)
  local k = self.kind
  if k ~= 'string' and k ~= 'number' and k ~= 'array' then
    config_error(which .. ' applies to strings, numbers and arrays, not ' .. k)
  end
  if k == 'number' then
    if type(n) ~= 'number' or n ~= n then config_error(which .. ' expects a number') end
  elseif not check.is_int(n) or n < 0 then
    config_error(which .. ' expects a whole number at least 0')
  end
  return with(self, which == 'min' and 'min_value' or 'max_value', n)
end

--- At least `n`: characters of a string, items of an array, or the value of a number.
function Schema:min(n) return bound(self, 'min', n) end

--- At most `n`: characters of a string, items of an array, or the value of a number.
function Schema:max(n) return bound(self, 'max', n) end

--- An object that refuses unknown keys instead of leaving them out.
function Schema:strict()
  if self.kind ~= 'object' then config_error('strict applies to objects') end
  return with(self, 'strict_keys', true)
end

-- }======================================================

-- {======================================================
-- Parsing
-- =======================================================

local function check_value(self, v)
  local cx = { path = {}, depth = 0, issues = {} }
  local out = run(self, v, cx)
  if #cx.issues > 0 then return false, cx.issues end
  return true, out
end

-- The INVALID_INPUT error for `issues`: its message is the first issue, with its path.
local function failure(issues)
  local first = issues[1]
  local message = first.where ~= '' and (first.where .. ': ' .. first.message) or first.message
  return errors.new('INVALID_INPUT', message, { issues = issues })
end

--- Returns `true, value` (a checked copy, unknown keys left out) or `false, issues, err`.
function Schema:safe_parse(v)
  if getmetatable(self) ~= SCHEMA_TAG then config_error('call safe_parse with a colon: schema:safe_parse(v)') end
  local ok, res = check_value(self, v)
  if ok then return true, res end
  return false, res, failure(res)
end

--- Returns a checked copy of `v`, or raises INVALID_INPUT naming the path of the first problem.
function Schema:parse(v)
  if getmetatable(self) ~= SCHEMA_TAG then config_error('call parse with a colon: schema:parse(v)') end
  local ok, res = check_value(self, v)
  if ok then return res end
  error(failure(res), 2)
end

-- }======================================================

-- {======================================================
-- JSON Schema
-- =======================================================

local function list(t)
  return setmetatable(t, array_mt)
end

local function render(s)
  local k = s.kind
  local out
  if k == 'string' then
    out = { type = 'string', minLength = s.min_value, maxLength = s.max_value }
  elseif k == 'number' then
    out = { type = s.integer and 'integer' or 'number', minimum = s.min_value, maximum = s.max_value }
  elseif k == 'boolean' then
    out = { type = 'boolean' }
  elseif k == 'literal' then
    local t = type(s.value)
    if t == 'number' then t = check.is_int(s.value) and 'integer' or 'number' end
    out = { type = t, const = s.value }
  elseif k == 'enum' then
    local values, types = list({}), {}
    for i, v in ipairs(s.values) do
      values[i] = v
      types[type(v)] = true
    end
    out = { enum = values }
    if types.string and not types.number then out.type = 'string'
    elseif types.number and not types.string then out.type = 'number' end
  elseif k == 'array' then
    out = { type = 'array', items = render(s.item), minItems = s.min_value, maxItems = s.max_value }
  elseif k == 'object' then
    local props, required = setmetatable({}, object_mt), list({})
    for _, key in ipairs(s.keys) do
      local f = s.shape[key]
      props[key] = render(f)
      if not f.is_optional and not f.has_default and f.kind ~= 'any' then required[#required + 1] = key end
    end
    out = { type = 'object', properties = props, required = required, additionalProperties = false }
  elseif k == 'union' then
    local any_of = list({})
    for i, o in ipairs(s.options) do any_of[i] = render(o) end
    out = { anyOf = any_of }
  else
    out = {}
  end
  out.description = s.description
  if s.has_default then out.default = deep_copy(s.default) end
  return setmetatable(out, object_mt)
end

--- The schema as JSON Schema: a new table each call, ready for `core.json.encode`.
function Schema:json_schema()
  if getmetatable(self) ~= SCHEMA_TAG then config_error('call json_schema with a colon: schema:json_schema()') end
  if not self._json then rawset(self, '_json', render(self)) end
  return deep_copy(self._json)
end

-- }======================================================

return M
