--- AWS Signature Version 4, as the specs' stand-ins check it: the verifier side of what
-- libcurl's CURLOPT_AWS_SIGV4 (and AWS's own SDKs) compute, written from AWS's published
-- description of the algorithm, on core.sha256 and core.hmac_sha256. Checked by spec against
-- AWS's published example (the get-vanilla case of the SigV4 test suite) and against requests
-- signed by AWS's own signer (@smithy/signature-v4).
--
--   local sigv4 = require('support.sigv4')
--   local ok, why = sigv4.verify(req, { access_key_id = 'AKID', secret_access_key = 'secret',
--     region = 'us-east-1', service = 'bedrock-agentcore', max_skew_ms = 300000 })
--   sigv4.signature(parts)   -- the hex signature of { method, path, query, headers, body, ... }
--
-- `req` is a stand-in request: `method`, `target` (path and query as sent), `headers` (lower-cased
-- names), `body`. `verify` returns true, or false and why (for the spec's own messages).
local core = require('mayura.core')

local M = {}

local function hex(s)
  return (s:gsub('.', function(c) return string.format('%02x', c:byte()) end))
end

local function unescape(s)
  return (s:gsub('%%(%x%x)', function(h) return string.char(tonumber(h, 16)) end))
end

-- AWS's URI encoding: unreserved characters kept, every other byte %XX in upper case.
local function aws_escape(s)
  return (s:gsub('[^%w%-%._~]', function(c) return string.format('%%%02X', c:byte()) end))
end

--- The canonical query string of a raw query (the part after '?').
function M.canonical_query(raw)
  if raw == nil or raw == '' then return '' end
  local pairs_ = {}
  for part in raw:gmatch('[^&]+') do
    local k, v = part:match('^([^=]*)=?(.*)$')
    pairs_[#pairs_ + 1] = { aws_escape(unescape((k:gsub('%+', ' ')))), aws_escape(unescape((v:gsub('%+', ' ')))) }
  end
  table.sort(pairs_, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  local out = {}
  for i, p in ipairs(pairs_) do out[i] = p[1] .. '=' .. p[2] end
  return table.concat(out, '&')
end

--- The signature (hex) of a request: `parts` = { method, path (canonical already), query (raw),
-- headers (lower-cased name -> value), signed (list of lower-cased names), body, amz_date,
-- scope_date, region, service, secret_access_key, payload_hash (optional) }.
function M.signature(parts)
  local names = {}
  for i, n in ipairs(parts.signed) do names[i] = n end
  table.sort(names)
  local lines = {}
  for _, n in ipairs(names) do
    local v = parts.headers[n] or ''
    v = v:gsub('^%s+', ''):gsub('%s+$', ''):gsub('%s+', ' ')
    lines[#lines + 1] = n .. ':' .. v .. '\n'
  end
  local canonical = table.concat({
    parts.method, parts.path, M.canonical_query(parts.query), table.concat(lines), table.concat(names, ';'),
    parts.payload_hash or hex(core.sha256(parts.body or '')),
  }, '\n')
  local scope = parts.scope_date .. '/' .. parts.region .. '/' .. parts.service .. '/aws4_request'
  local to_sign = 'AWS4-HMAC-SHA256\n' .. parts.amz_date .. '\n' .. scope .. '\n' .. hex(core.sha256(canonical))
  local k = core.hmac_sha256('AWS4' .. parts.secret_access_key, parts.scope_date)
  k = core.hmac_sha256(k, parts.region)
  k = core.hmac_sha256(k, parts.service)
  k = core.hmac_sha256(k, 'aws4_request')
  return hex(core.hmac_sha256(k, to_sign))
end

-- Seconds since the epoch of an ISO 8601 basic date-time (20150830T123600Z), or nil.
local function epoch_ms(amz)
  local y, mo, d, h, mi, s = amz:match('^(%d%d%d%d)(%d%d)(%d%d)T(%d%d)(%d%d)(%d%d)Z$')
  if not y then return nil end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  if mo <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (mo + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  local days = era * 146097 + doe - 719468
  return ((days * 24 + tonumber(h)) * 60 + tonumber(mi)) * 60000 + tonumber(s) * 1000
end

--- Checks `req`'s Authorization header against `opts` (see the module's comment).
function M.verify(req, opts)
  local auth = req.headers.authorization
  if type(auth) ~= 'string' then return false, 'no Authorization header' end
  local cred, signed, sig = auth:match('^AWS4%-HMAC%-SHA256 Credential=([^,%s]+),%s*SignedHeaders=([^,%s]+),%s*'
    .. 'Signature=(%x+)$')
  if not cred then return false, 'not an AWS4-HMAC-SHA256 Authorization header' end
  local key, date, region, service, term = cred:match('^([^/]+)/(%d%d%d%d%d%d%d%d)/([^/]+)/([^/]+)/([^/]+)$')
  if not key or term ~= 'aws4_request' then return false, 'a malformed credential scope' end
  if key ~= opts.access_key_id then return false, 'an unknown access key' end
  if region ~= opts.region or service ~= opts.service then return false, 'the wrong region or service' end
  local amz = req.headers['x-amz-date']
  if type(amz) ~= 'string' or amz:sub(1, 8) ~= date then return false, 'no X-Amz-Date of the scope\'s day' end
  local at = epoch_ms(amz)
  if not at then return false, 'a malformed X-Amz-Date' end
  if opts.max_skew_ms and math.abs(core.now_ms() - at) > opts.max_skew_ms then return false, 'a stale signature' end
  local names, seen = {}, {}
  for n in signed:gmatch('[^;]+') do
    names[#names + 1] = n
    seen[n] = true
  end
  if not seen.host or not seen['x-amz-date'] then return false, 'host and x-amz-date are not signed' end
  if req.headers['x-amz-security-token'] ~= opts.session_token then return false, 'the wrong session token' end
  local path, query = req.target:match('^([^?]*)%??(.*)$')
  local want = M.signature({
    method = req.method, path = path, query = query, headers = req.headers, signed = names, body = req.body,
    amz_date = amz, scope_date = date, region = region, service = service,
    secret_access_key = opts.secret_access_key, payload_hash = req.headers['x-amz-content-sha256'],
  })
  if want ~= sig then return false, 'the signature does not match' end
  return true
end

return M
