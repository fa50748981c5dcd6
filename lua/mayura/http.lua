--- mayura.http: HTTP requests on the shared loop, for providers and model adapters.
--
-- `request(opts)` waits for `core.http.request` (libcurl's multi interface
-- driven by the loop) and returns `{ status, headers, body }`, or raises a
-- coded error: TIMEOUT, CANCELLED, CONNECT_FAILED, NETWORK_ERROR,
-- LIMIT_EXCEEDED or INVALID_INPUT. `opts.signal` takes a cancel token.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')

local M = {}

--- Makes a request: `{ url, method, headers, body, timeout_ms, connect_timeout_ms,
-- unix_socket, on_data, on_headers, max_body_bytes, signal }`.
function M.request(opts)
  if type(opts) ~= 'table' then errors.raise('INVALID_INPUT', 'request expects an options table') end
  local token = opts.signal
  if token ~= nil and not task.is_token(token) then
    errors.raise('INVALID_INPUT', 'signal must be a cancel token')
  end
  if token and token.cancelled then errors.raise('CANCELLED', 'cancelled before it started') end
  local spec = {}
  for k, v in pairs(opts) do if k ~= 'signal' then spec[k] = v end end
  local remove
  local res, err = task.await(function(done)
    local handle = core.http.request(spec, done)
    if token then remove = token:on_cancel(function() handle:cancel() end) end
  end)
  if remove then remove() end
  if not res then error(err, 2) end
  return res
end

return M
