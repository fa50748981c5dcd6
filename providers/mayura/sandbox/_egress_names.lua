--- mayura.sandbox._egress_names: what the egress proxy (mayura.sandbox._egress) checks of the
-- names and addresses a sandbox hands it: the allow-list and its matching, a host name's
-- spelling, whether an address is public, and the server name (SNI) a TLS ClientHello carries,
-- read as its records come. Pure functions over strings, no I/O. Private to the proxy.
local M = {}

local MAX_HELLO = 65536         -- a ClientHello, across its records
M.MAX_HELLO_RECORDS = 64        -- the records it may take (one, a few with large key shares)

--- The allow-list as { exact = { [name] = true }, suffixes = { '.name', ... } }.
function M.compile(allow)
  local list = { exact = {}, suffixes = {} }
  for _, entry in ipairs(allow) do
    local e = entry:lower():gsub('%.$', '')
    if e:sub(1, 2) == '*.' then e = e:sub(2) end
    if e:sub(1, 1) == '.' then list.suffixes[#list.suffixes + 1] = e
    else list.exact[e] = true end
  end
  return list
end

--- 'exact', 'wildcard' or nil: how `name` (normalised) is on the list.
function M.match(list, name)
  if list.exact[name] then return 'exact' end
  for _, suffix in ipairs(list.suffixes) do
    if #name > #suffix and name:sub(-#suffix) == suffix then return 'wildcard' end
  end
  return nil
end

--- A host of a request normalised (lower case, no trailing dot), or nil and a reason.
function M.normalise_host(host)
  if host:find('[%[%]:]') then return nil, 'ip_literal' end
  host = host:lower():gsub('%.$', '')
  if host == '' or #host > 253 or not host:match('^[%w%-%.]+$') or host:find('..', 1, true)
    or host:sub(1, 1) == '.' then
    return nil, 'bad_request'
  end
  -- every spelling of an IPv4 address inet_aton takes: 1 to 4 parts, decimal, octal or hex
  local numeric = true
  for label in host:gmatch('[^.]+') do
    if not (label:match('^%d+$') or label:match('^0[xX]%x*$')) then numeric = false end
  end
  -- and a name whose last label is a number is no domain either
  if numeric or host:match('%.%d+$') then return nil, 'ip_literal' end
  for label in host:gmatch('[^.]+') do
    if #label > 63 or label:sub(1, 1) == '-' or label:sub(-1) == '-' then return nil, 'bad_request' end
  end
  return host
end

local function v4_parts(addr)
  local a, b, c, d = addr:match('^(%d+)%.(%d+)%.(%d+)%.(%d+)$')
  if not a then return nil end
  return tonumber(a), tonumber(b), tonumber(c), tonumber(d)
end

-- IPv4 blocks no sandbox reaches: "this network", private, shared (100.64/10), loopback,
-- link-local, IETF protocol assignments, the documentation nets, 6to4 relays, benchmarking,
-- multicast, reserved and broadcast (the IANA special-purpose registry, and more).
local function v4_blocked(addr)
  local a, b, c, d = v4_parts(addr)
  if not a or a > 255 or b > 255 or c > 255 or d > 255 then return true end
  return a == 0 or a == 10 or a == 127 or a >= 224
    or (a == 100 and b >= 64 and b <= 127)
    or (a == 169 and b == 254)
    or (a == 172 and b >= 16 and b <= 31)
    or (a == 192 and b == 168)
    or (a == 192 and b == 0 and (c == 0 or c == 2))
    or (a == 192 and b == 88 and c == 99)
    or (a == 198 and (b == 18 or b == 19))
    or (a == 198 and b == 51 and c == 100)
    or (a == 203 and b == 0 and c == 113)
end

-- The 8 groups of an IPv6 address as numbers, or nil.
local function v6_groups(addr)
  if not addr:match('^[%x:.]+$') then return nil end
  local tail4 = addr:match(':(%d+%.%d+%.%d+%.%d+)$')
  if tail4 then
    local a, b, c, d = v4_parts(tail4)
    if not a or a > 255 or b > 255 or c > 255 or d > 255 then return nil end
    addr = addr:sub(1, #addr - #tail4) .. ('%x:%x'):format(a * 256 + b, c * 256 + d)
  end
  local head, rest = addr:match('^(.-)::(.*)$')
  local groups = {}
  local function add(s, into)
    for g in s:gmatch('[^:]+') do
      if #g > 4 then return false end
      into[#into + 1] = tonumber(g, 16)
    end
    return true
  end
  if head then
    local tail = {}
    if not add(head, groups) or not add(rest, tail) or #groups + #tail > 7 then return nil end
    for _ = 1, 8 - #groups - #tail do groups[#groups + 1] = 0 end
    for _, g in ipairs(tail) do groups[#groups + 1] = g end
  elseif not add(addr, groups) then
    return nil
  end
  if #groups ~= 8 then return nil end
  return groups
end

local function v4_of(hi, lo)
  return ('%d.%d.%d.%d'):format(math.floor(hi / 256), hi % 256, math.floor(lo / 256), lo % 256)
end

--- Whether a sandbox may reach `addr` (a numeric address, as a resolver answers it): a public
-- IPv4 address, or a global unicast IPv6 one (2000::/3) outside the special-purpose blocks; an
-- IPv4-mapped (::ffff:0:0/96) or NAT64 (64:ff9b::/96) address as the IPv4 address inside.
function M.public_address(addr)
  if not addr:find(':', 1, true) then return not v4_blocked(addr) end
  local g = v6_groups(addr)
  if not g then return false end
  local zero5 = g[1] == 0 and g[2] == 0 and g[3] == 0 and g[4] == 0 and g[5] == 0
  if zero5 and g[6] == 0xffff then return not v4_blocked(v4_of(g[7], g[8])) end
  if g[1] == 0x64 and g[2] == 0xff9b and g[3] == 0 and g[4] == 0 and g[5] == 0 and g[6] == 0 then
    return not v4_blocked(v4_of(g[7], g[8]))
  end
  local top = g[1]
  if top < 0x2000 or top > 0x3fff then return false end        -- not global unicast
  if top == 0x2001 and g[2] < 0x200 then return false end      -- IETF protocol assignments (Teredo, ...)
  if top == 0x2001 and g[2] == 0xdb8 then return false end     -- documentation
  if top == 0x2002 then return false end                       -- 6to4: an IPv4 address inside
  if top == 0x3fff and g[2] < 0x1000 then return false end     -- documentation (3fff::/20)
  return true
end

-- The server name extension of a whole ClientHello handshake body (after its 4-byte header).
local function hello_name(hs)
  local p = 1 + 2 + 32
  local function u8() local v = hs:byte(p); p = p + 1; return v end
  local function u16()
    local a, b = hs:byte(p, p + 1)
    p = p + 2
    if not b then return nil end
    return a * 256 + b
  end
  local sid = u8()
  if not sid then return nil, 'bad' end
  p = p + sid
  local suites = u16()
  if not suites then return nil, 'bad' end
  p = p + suites
  local comp = u8()
  if not comp then return nil, 'bad' end
  p = p + comp
  local ext_total = u16()
  if not ext_total or p + ext_total - 1 > #hs then return nil, 'bad' end
  local ext_end = p + ext_total
  local name
  while p + 4 <= ext_end do
    local etype, elen = u16(), u16()
    if p + elen > ext_end then return nil, 'bad' end
    if etype == 0 then
      if name then return nil, 'bad' end
      local q, list_end = p + 2, p + elen
      local count = 0
      while q + 3 <= list_end do
        local ntype = hs:byte(q)
        local nlen = hs:byte(q + 1) * 256 + hs:byte(q + 2)
        if q + 3 + nlen > list_end then return nil, 'bad' end
        if ntype == 0 then
          count = count + 1
          name = hs:sub(q + 3, q + 2 + nlen)
        end
        q = q + 3 + nlen
      end
      if count ~= 1 then return nil, 'bad' end
    end
    p = p + elen
  end
  if not name then return nil, 'bad' end
  return name
end

--- Steps the ClientHello readers have taken, all of them (each takes one or more bytes); specs
-- read it to see that the work grows with the bytes, never with their square.
M.hello_steps = 0

--- A reader of a TLS ClientHello fed as it arrives: `reader(chunk)` returns the server name it
-- asks for; or nil and 'more' while more bytes are needed; or nil and 'bad' when they are no
-- ClientHello with one server name, or it takes more than MAX_HELLO_RECORDS records or MAX_HELLO
-- bytes. Each byte is looked at once: the work is linear in what arrives.
function M.hello_reader()
  local header = ''          -- a record header read in part
  local left = 0             -- bytes of the current record still to come
  local records = 0
  local pieces, have = {}, 0 -- the handshake message so far
  local want                 -- its whole length, once its own header is in
  local result, why
  local function feed(chunk)
    if result or why then return result, why or 'bad' end
    local pos, n = 1, #chunk
    while pos <= n do
      M.hello_steps = M.hello_steps + 1
      if left == 0 then
        local take = math.min(5 - #header, n - pos + 1)
        header = header .. chunk:sub(pos, pos + take - 1)
        pos = pos + take
        if #header == 5 then
          local ctype, major = header:byte(1), header:byte(2)
          left = header:byte(4) * 256 + header:byte(5)
          header = ''
          records = records + 1
          if ctype ~= 22 or major ~= 3 or left == 0 or left > 16384 + 2048 or records > M.MAX_HELLO_RECORDS then
            why = 'bad'
            return nil, why
          end
        end
      else
        local take = math.min(left, n - pos + 1)
        pieces[#pieces + 1] = chunk:sub(pos, pos + take - 1)
        have, left, pos = have + take, left - take, pos + take
        if not want and have >= 4 then
          -- at most 4 pieces make up the first 4 bytes
          local first = table.concat(pieces)
          pieces = { first }
          if first:byte(1) ~= 1 then why = 'bad'; return nil, why end
          want = 4 + first:byte(2) * 65536 + first:byte(3) * 256 + first:byte(4)
          if want > MAX_HELLO then why = 'bad'; return nil, why end
        end
        if want and have >= want then
          result, why = hello_name(table.concat(pieces):sub(5, want))
          return result, why
        end
      end
    end
    return nil, 'more'
  end
  return feed
end

--- The server name a TLS ClientHello (its records' bytes, all at once) asks for, as hello_reader.
function M.client_hello_sni(data)
  return M.hello_reader()(data)
end

return M
