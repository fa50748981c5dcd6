--- AWS event-stream messages (application/vnd.amazon.eventstream) for the specs' stand-ins:
-- `message(headers, payload)` frames one (prelude, its CRC-32, headers, payload, the message's
-- CRC-32); `headers` is a list of { name, value } with string values (type 7) or
-- { name, value, 'bool' } for a boolean. core.stream_parser('eventstream') reads them back.
local core = require('mayura.core')

local M = {}

local function be32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
end

local function be16(n)
  return string.char(math.floor(n / 256) % 256, n % 256)
end

--- One framed message.
function M.message(headers, payload)
  local hs = {}
  for _, h in ipairs(headers) do
    local name, value, kind = h[1], h[2], h[3]
    if kind == 'bool' then
      hs[#hs + 1] = string.char(#name) .. name .. string.char(value and 0 or 1)
    else
      hs[#hs + 1] = string.char(#name) .. name .. string.char(7) .. be16(#value) .. value
    end
  end
  local head = table.concat(hs)
  local total = 12 + #head + #payload + 4
  local prelude = be32(total) .. be32(#head)
  prelude = prelude .. be32(core.crc32(prelude))
  local body = prelude .. head .. payload
  return body .. be32(core.crc32(body))
end

--- An event message: `:message-type` event, `:event-type` `kind`, JSON `value` as the payload.
function M.event(kind, value)
  return M.message({ { ':message-type', 'event' }, { ':event-type', kind }, { ':content-type', 'application/json' } },
    core.json.encode(value))
end

--- An exception message: `:message-type` exception, `:exception-type` `kind`, `{ message }`.
function M.exception(kind, message)
  return M.message({ { ':message-type', 'exception' }, { ':exception-type', kind },
    { ':content-type', 'application/json' } }, core.json.encode({ message = message }))
end

return M
