--- mayura.sandbox._hosted: what the providers of hosted sandbox services share.
--
-- A provider for a hosted service (E2B, Daytona, Vercel, Fly, ...) talks
-- JSON over HTTPS to the service's API and reads its streamed answers. The
-- kit does that part once, through `mayura.http` (libcurl on the loop):
--
--   local hosted = require('mayura.sandbox._hosted')
--   local client = hosted.client({
--     label = 'e2b',                    -- names the service in our messages
--     base_url = 'https://api.e2b.app',
--     api_key = key,                    -- sent in a header, never in a URL or a message
--     auth_header = 'X-API-Key',        -- default 'Authorization' (with auth_prefix 'Bearer ')
--     call_timeout_ms = 120000,         -- a whole call, retries and waits included
--     retries = 2,
--   })
--
-- A service signed with AWS Signature V4 (AgentCore) gives `aws_sigv4 =
-- 'aws:amz:<region>:<service>'` and `aws_credentials = { access_key_id,
-- secret_access_key, session_token }` instead of `api_key`: libcurl signs
-- each request itself (CURLOPT_AWS_SIGV4), the session token travels in
-- X-Amz-Security-Token, and all three are secrets of the client.
-- `http_version = '2'` makes every request of the client HTTP/2 (with prior
-- knowledge to an http:// base URL, by ALPN over TLS), for a service that
-- speaks nothing else; '1.1' keeps it to HTTP/1.1. `ca_file` (a PEM file of the
-- authorities to trust instead of the system's) or `ca_pem` (that PEM text), and `client_cert` with
-- `client_key` (PEM files: TLS client authentication) are absolute paths.
--   local body, res = client:json('POST', '/sandboxes', { templateID = 'base' })
--   client:json('GET', '/sandboxes/' .. hosted.escape(id), nil, { gone = true })
--   client:stream('POST', '/process.Process/Start', msg, { format = 'connect', on_event = fn })
--
-- What a call promises:
--   * every request names mayura and its version (`User-Agent: mayura/<core.version>`,
--     `M.USER_AGENT`; a WebSocket handshake of a provider sends it too);
--   * the API key travels only in the auth header; no error message, field or
--     log line carries it (messages are ours; any secret is scrubbed from
--     them once more before they are raised);
--   * a service's own error text never reaches the caller: a non-2xx answer
--     is `sandbox_http_failure(status)` with our message naming the call, its
--     `status`, and `provider_code` when the body has a short plain code
--     (`error_code`, `code`, `error.code`, `type`) that is not the key;
--   * 429, 502, 503 and 504 are tried again up to `retries` times, as is a
--     connection that could not be made; a connection cut midway only for an
--     idempotent call (GET, HEAD, PUT, DELETE, OPTIONS, or `idempotent =
--     true`). The wait is the server's `retry-after` (seconds or an HTTP
--     date) or `retry-after-ms`, else `min(retry_base_ms * 2^n, 8 s)` with
--     jitter. A wait the server asks for that is above `max_retry_after_ms`,
--     or that would pass the call's deadline, is not waited: the error is
--     raised at once with `retry_after_ms` on it;
--   * every call ends within its `timeout_ms` (the client's
--     `call_timeout_ms` by default): the deadline covers every attempt and
--     every wait, and no answer in time is SANDBOX_ERROR `timeout`;
--   * `gone = true` says the call is about a sandbox that existed: then 404
--     and 410 mean SANDBOX_ERROR `gone` (a list of statuses may be given;
--     a status it names is never tried again, even 502 or 503);
--   * a 2xx body that is not JSON, a stream that breaks its format, or a
--     message above the size caps is SANDBOX_ERROR `failed`; no connection
--     is `unavailable`; a cancelled `signal` is CANCELLED.
--
-- Streams (`client:stream`) read Connect envelopes, NDJSON, SSE or AWS event-stream through
-- `core.stream_parser` as bytes arrive. `on_event(value)` gets each message
-- (the decoded JSON for 'connect' and 'ndjson', `{ event, data, id }` for
-- 'sse', `{ data, headers, message_type, event }` for 'eventstream'), is called
-- from the loop and must not wait; returning false ends
-- the stream early, raising ends it with that error. A Connect stream must
-- end with its end-of-stream envelope; an error in it is mapped like an HTTP
-- status (`connect_status`). A stream is retried only before its first byte.
--
-- Helpers: `lifetime(ms, { unit, min, max })` (a lifetime in the service's
-- unit, rounded up and clamped), `metadata(labels, limits)` (labels as the
-- service's string map), `escape(segment)` and `query(params)` for URLs,
-- `connect_envelope(text, end_stream)` and `connect_status(code)`.
--
-- This file re-exports its pieces: _hosted_client (the client), _hosted_stream (its streams),
-- _hosted_wire (the helpers above) and _hosted_command (the command backend providers' options).
local wire = require('mayura.sandbox._hosted_wire')
local client = require('mayura.sandbox._hosted_client')
local command = require('mayura.sandbox._hosted_command')

local M = {}

M.USER_AGENT = client.USER_AGENT
M.GONE_STATUSES = client.GONE_STATUSES
M.RETRY_STATUSES = client.RETRY_STATUSES
M.client = client.client

M.decode = wire.decode
M.escape = wire.escape
M.query = wire.query
M.lifetime = wire.lifetime
M.metadata = wire.metadata
M.connect_envelope = wire.connect_envelope
M.connect_status = wire.connect_status

M.workdir_option = command.workdir_option
M.env_object = command.env_object
M.wait_ms = command.wait_ms
M.rate_option = command.rate_option

return M
