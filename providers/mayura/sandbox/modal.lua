--- mayura.sandbox.modal: Modal sandboxes (https://modal.com/docs/guide/sandboxes) are not
-- offered yet; `modal_sandboxes(options)` refuses with INVALID_CONFIG and says why.
--
--   local modal = require('mayura.sandbox.modal')
--   modal.modal_sandboxes({ token_id = id, token_secret = secret })
--   --> INVALID_CONFIG: modal: not supported: Modal's API is gRPC only ...
--
-- Why: Modal has no REST or JSON API. Every call is gRPC (service modal.client.ModalClient,
-- binary protobuf over HTTP/2, status in the trailers), and commands and their output go to a
-- second gRPC service on each worker (TaskCommandRouter), reached with a short-lived token from
-- the first. Doing that from the core means HTTP/2 with trailers through libcurl, protobuf for
-- some thirty messages of Modal's own .proto files (which change with each client release), and a
-- stand-in that speaks gRPC over HTTP/2 for the specs (the loopback server the specs use speaks
-- HTTP/1.1). The building blocks are kept libraries (libcurl's HTTP/2, protobuf-c, nghttp2), but
-- Modal's .proto files are not on the machines this is built on, and messages written from the
-- documentation's field lists, unchecked against the real service, would fail in ways no stand-in
-- of ours could show. Until then a pool asks for what it can have: the refusal names the
-- providers that run a sandbox behind an HTTP API.
--
-- The options are read (so that a mistyped option is still the caller's INVALID_CONFIG) and
-- never shown: no token ends up in the message.
local errors = require('mayura.errors')

local M = {}

M.REASON = 'modal: not supported: Modal\'s API is gRPC only (protobuf over HTTP/2, with a per-worker ' ..
  'command service), which this library does not speak yet; use e2b, daytona, vercel, fly or cloudflare'

--- Refuses: see the module's comment.
function M.modal_sandboxes(options)
  if options ~= nil and type(options) ~= 'table' then
    errors.raise('INVALID_CONFIG', 'modal_sandboxes takes an options table', nil, 2)
  end
  errors.raise('INVALID_CONFIG', M.REASON, nil, 2)
end

return M
