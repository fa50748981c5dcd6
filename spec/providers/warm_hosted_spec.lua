-- Warm sandboxes on hosted providers (the kit's `warm = N`, mayura.sandbox._kit), against the
-- stand-ins of E2B (and its desktop), Fly, Vercel, Daytona, Northflank, Railway, CodeSandbox,
-- Cloudflare, AgentCore and Modal: made ahead with the pool's labels (where the service keeps
-- labels), claimed by a create of their shape (no create call then, and the create's env and
-- lifetime taken), passed over by a create of another shape, counted in max_sandboxes, ended at
-- the pool's close, and given up for a cold create when the service ended one meanwhile.
local core = require('mayura.core')
local http = require('mayura.http')
local task = require('mayura._task')
local sandbox = require('mayura.sandbox')
local e2b = require('mayura.sandbox.e2b')
local e2b_desktop = require('mayura.sandbox.e2b_desktop')
local fly = require('mayura.sandbox.fly')
local stand_in = require('support.stand_in')
local suite = require('support.stand_in_suite')
local e2b_service = require('support.e2b_service')
local fly_service = require('support.fly_service')
local vercel = require('mayura.sandbox.vercel')
local vercel_service = require('support.vercel_service')
local daytona = require('mayura.sandbox.daytona')
local daytona_service = require('support.daytona_service')
local northflank = require('mayura.sandbox.northflank')
local northflank_service = require('support.northflank_service')
local railway = require('mayura.sandbox.railway')
local codesandbox = require('mayura.sandbox.codesandbox')
local codesandbox_service = require('support.codesandbox_service')
local util = require('support.util')
local cloudflare = require('mayura.sandbox.cloudflare')
local cloudflare_service = require('support.cloudflare_service')
local agentcore = require('mayura.sandbox.agentcore')
local agentcore_service = require('support.agentcore_service')
local modal = require('mayura.sandbox.modal')
local modal_stand_in = require('support.modal_stand_in')
local grpc = require('mayura.sandbox._grpc')
local railway_service = require('support.railway_service')

local KEY = 'e2b_0123456789abcdef0123456789abcdef'
local TOKEN = 'fo1_warmspectoken0123456789'
local APP = 'warm-app'
local VERCEL = { token = 'vercel_warm_token_0123456789', team_id = 'team_warm', project_id = 'prj_warm' }
local RAILWAY = { token = 'railway-warm-token-0123456789', environment_id = 'env-warm' }
local CODESANDBOX = 'csb_warm_token_0123456789'
local CLOUDFLARE = 'cf-warm-bridge-key-0123456789'
local MODAL = { token_id = 'ak-warm0123456789ID', token_secret = 'as-warm0123456789abcdefSECRET' }
local AWS = { access_key_id = 'AKIAMAYURAWARM0KEYID', secret_access_key = 'mayura/Warm+Secret0123456789abcdefSECRET',
  session_token = 'IQoJb3JpZ2luX2VjEMayuraWarmTOKEN0123' }
local NORTHFLANK = { token = 'nf-warm-token-0123456789', project_id = 'warm-project' }

-- The labels a create body carries (nil where the service takes none).
local function labels_of(b)
  return b.metadata or (b.config and b.config.metadata) or b.tags or b.labels
end

local function wait_for(what, fn)
  local deadline = core.hrtime_ms() + 30000
  while not fn() do
    if core.hrtime_ms() > deadline then error('timed out waiting for ' .. what) end
    task.sleep(20)
  end
end

-- How many entries of `t` hold `pred(key, value)`.
local function count(t, pred)
  local n = 0
  for k, v in pairs(t) do
    if pred(k, v) then n = n + 1 end
  end
  return n
end

-- For a service that keeps no labels.
local function no_labels() return nil end

-- The E2B stand-in's (for E2B and its desktop): made, a sandbox killed there, those alive.
local function e2b_install(svc, backing) return e2b_service.install(svc, backing, { api_key = KEY }) end
local function e2b_kill(svc, b)
  return http.request({ method = 'DELETE', url = svc:url('/sandboxes/' .. b.id), headers = { ['X-API-Key'] = KEY } })
end
local function e2b_alive(state)
  return count(state.sandboxes, function(id) return state:_live(id) end)
end

-- Each stand-in: how to make it, the provider (with `warm`), its create route, how many
-- sandboxes it holds alive, and what a create asks for there.
local services = {
  {
    name = 'e2b',
    install = e2b_install,
    provider = function(svc, warm)
      return e2b.e2b_sandboxes({ api_key = KEY, api_url = svc:url(''), sandbox_url = svc:url(''),
        workdir = '/workspace', retry_base_ms = 20, warm = warm })
    end,
    create_route = { 'POST', '/v2/sandboxes' },
    kill = e2b_kill, alive = e2b_alive,
    network = 'none',
  },
  {
    name = 'e2b-desktop',
    install = e2b_install,
    provider = function(svc, warm)
      return e2b_desktop.e2b_desktop_sandboxes({ api_key = KEY, api_url = svc:url(''), sandbox_url = svc:url(''),
        workdir = '/workspace', retry_base_ms = 20, resolution = { 800, 600 }, warm = warm })
    end,
    create_route = { 'POST', '/v2/sandboxes' },
    kill = e2b_kill, alive = e2b_alive,
    network = 'none',
    desktop = true,   -- every sandbox has one: a create asking for it takes a warm one, its display up
  },
  {
    name = 'fly',
    install = function(svc, backing) return fly_service.install(svc, backing, { token = TOKEN, app = APP }) end,
    provider = function(svc, warm)
      return fly.fly_sandboxes({ token = TOKEN, app = APP, base_url = svc:url(''), retry_base_ms = 20,
        exec_rate = { per_second = 100, burst = 20 }, warm = warm })
    end,
    create_route = { 'POST', '/v1/apps/{app}/machines' },
    kill = function(svc, b)
      return http.request({ method = 'DELETE', url = svc:url('/v1/apps/' .. APP .. '/machines/' .. b.machine_id
        .. '?kill=true'), headers = { Authorization = 'Bearer ' .. TOKEN } })
    end,
    alive = function(state)
      local n = 0
      for _, m in pairs(state.machines) do
        if m.state ~= 'destroyed' then n = n + 1 end
      end
      return n
    end,
    network = 'all',
  },
  {
    name = 'vercel',
    install = function(svc, backing) return vercel_service.install(svc, backing, VERCEL) end,
    provider = function(svc, warm)
      return vercel.vercel_sandboxes({ token = VERCEL.token, team_id = VERCEL.team_id,
        project_id = VERCEL.project_id, base_url = svc:url('/api'), workdir = '/workspace', retry_base_ms = 20,
        warm = warm })
    end,
    create_route = { 'POST', '/api/v3/sandboxes' },
    kill = function(svc, b)
      return http.request({ method = 'DELETE', url = svc:url('/api/v2/sandboxes/' .. b.name .. '?projectId='
        .. VERCEL.project_id .. '&teamId=' .. VERCEL.team_id), headers = { Authorization = 'Bearer ' .. VERCEL.token } })
    end,
    alive = function(state) return count(state.sandboxes, function() return true end) end,
    network = 'none',
  },
  {
    name = 'daytona',
    -- the Daytona stand-in makes its own service and backing
    start = function() return daytona_service.new({ api_key = KEY }) end,
    provider = function(svc, warm)
      return daytona.daytona_sandboxes({ api_key = KEY, base_url = svc:url('/api'), retry_base_ms = 20, warm = warm })
    end,
    create_route = { 'POST', '/api/sandbox' },
    kill = function(svc, b)
      return http.request({ method = 'DELETE', url = svc:url('/api/sandbox/' .. b.id),
        headers = { Authorization = 'Bearer ' .. KEY } })
    end,
    alive = function(_, svc) return svc.daytona.count() end,
    network = 'none',
  },
  {
    name = 'northflank',
    install = function(svc, backing)
      return northflank_service.install_with_exec_host(svc, backing, NORTHFLANK)
    end,
    provider = function(svc, warm, state)
      return northflank.northflank_sandboxes({ token = NORTHFLANK.token, project_id = NORTHFLANK.project_id,
        api_url = svc:url(''), exec_url = state.exec_url, retry_base_ms = 20, warm = warm })
    end,
    create_route = { 'POST', '/v1/projects/{p}/services/deployment' },
    kill = function(svc, b)
      return http.request({ method = 'DELETE', url = svc:url('/v1/projects/' .. NORTHFLANK.project_id .. '/services/'
        .. b.id), headers = { Authorization = 'Bearer ' .. NORTHFLANK.token } })
    end,
    alive = function(state) return count(state.services, function(_, rec) return not rec.deleted end) end,
    labels_of = no_labels,   -- a Northflank service carries no labels
    network = 'all',
  },
  {
    name = 'railway',
    install = function(svc, backing) return railway_service.install_with_front(svc, backing, RAILWAY) end,
    provider = function(svc, warm, state)
      return railway.railway_sandboxes({ token = RAILWAY.token, environment_id = RAILWAY.environment_id,
        endpoint = svc:url(railway_service.PATH), ws_url = state.ws_url, retry_base_ms = 20, warm = warm })
    end,
    create_bodies = function(state)
      local out = {}
      for i, o in ipairs(state:calls('sandboxCreate')) do out[i] = o.variables.input end
      return out
    end,
    kill = function(_, b, state)   -- destroyed behind the client's back
      state:vanish(b.id)
      return { status = 200 }
    end,
    alive = function(state) return count(state.sandboxes, function(_, rec) return rec.backing_id ~= nil end) end,
    labels_of = no_labels,   -- a Railway sandbox carries no labels
    network = 'all',
  },
  {
    name = 'codesandbox',
    install = function(svc, backing)
      local state = codesandbox_service.install(svc, backing, { token = CODESANDBOX })
      state:start_front(util.tmpdir())
      state.close_all = state.close
      return state
    end,
    provider = function(svc, warm)
      return codesandbox.codesandbox_sandboxes({ token = CODESANDBOX, base_url = svc:url(''),
        workdir = codesandbox_service.WORKSPACE, retry_base_ms = 20, warm = warm })
    end,
    create_route = { 'POST', '/sandbox/{template}/fork' },
    kill = function(_, b, state)   -- deleted behind the client's back: its connections close
      state:vanish(b.id)
      return { status = 200 }
    end,
    alive = function(state) return count(state.sandboxes, function() return true end) end,
    labels_of = no_labels,   -- a CodeSandbox sandbox carries no labels
    network = 'all',
  },
  {
    name = 'cloudflare',
    install = function(svc, backing) return cloudflare_service.install(svc, backing, { api_key = CLOUDFLARE }) end,
    provider = function(svc, warm)
      return cloudflare.cloudflare_sandboxes({ worker_url = svc:url(''), api_key = CLOUDFLARE, retry_base_ms = 20,
        warm = warm })
    end,
    create_route = { 'POST', '/v1/sandbox' },
    kill = function(svc, b)   -- the bridge drops the container: the next command would get a fresh one
      return http.request({ method = 'DELETE', url = svc:url('/v1/sandbox/' .. b.sandbox_id),
        headers = { Authorization = 'Bearer ' .. CLOUDFLARE } })
    end,
    alive = function(_, svc)   -- the ids minted less those deleted
      local deleted = {}
      for _, req in ipairs(svc:calls('DELETE', '/v1/sandbox/{id}')) do deleted[req.params.id] = true end
      local n = #svc:calls('POST', '/v1/sandbox')
      for _ in pairs(deleted) do n = n - 1 end
      return n
    end,
    labels_of = no_labels,   -- the bridge keeps no labels
    network = 'all',
  },
  {
    name = 'agentcore',
    install = function(svc, backing)
      return agentcore_service.install(svc, backing, { access_key_id = AWS.access_key_id,
        secret_access_key = AWS.secret_access_key, session_token = AWS.session_token, region = 'us-east-1' })
    end,
    provider = function(svc, warm)
      return agentcore.agentcore_sandboxes({ region = 'us-east-1', credentials = AWS, endpoint = svc:url(''),
        retry_base_ms = 20, warm = warm })
    end,
    create_route = { 'PUT', '/code-interpreters/{ci}/sessions/start' },
    kill = function(_, b, state)   -- the session ends on AgentCore's side
      local session = state.sessions[b.session_id]
      session.status = 'TERMINATED'
      return { status = 200 }
    end,
    alive = function(state) return count(state.sessions, function(_, x) return x.status == 'READY' end) end,
    labels_of = no_labels,   -- a session keeps no labels
    network = 'all',
  },
  {
    name = 'modal',
    available = modal_stand_in.available,   -- a gRPC server on node's @grpc/grpc-js
    start = function()
      local stand = modal_stand_in.start(MODAL)
      stand.close = stand.stop
      return stand
    end,
    provider = function(stand, warm)
      return modal.modal_sandboxes({ token_id = MODAL.token_id, token_secret = MODAL.token_secret,
        server_url = stand.url, retry_base_ms = 20, warm = warm })
    end,
    create_bodies = function(_, stand)
      local out = {}
      for i, call in ipairs(stand:calls('SandboxCreateV2')) do out[i] = call.request end
      return out
    end,
    kill = function(stand, b)
      local c = grpc.client({ label = 'modal', base_url = stand.url,
        metadata = { ['x-modal-token-id'] = MODAL.token_id, ['x-modal-token-secret'] = MODAL.token_secret } })
      c:call('/modal.client.ModalClient/SandboxTerminateV2', { sandbox_id = (b.id:gsub('^modal%-', '')) })
      return { status = 200 }
    end,
    alive = function(_, stand)
      return count(stand:sandboxes(), function(_, sb) return sb.state ~= 'ended' end)
    end,
    labels_of = function(req)   -- Modal's tags
      local labels = {}
      for _, tag in ipairs(req.tags or {}) do labels[tag.tag_name] = tag.tag_value end
      return labels
    end,
    network = 'none',
  },
}

describe('warm = N on hosted providers: failure modes', function()
  it('a warm count that is not a whole number from 0 to 64 is INVALID_CONFIG', function()
    for _, bad in ipairs({ -1, 65, 1.5, 'two', true }) do
      assert.raises_code('INVALID_CONFIG', e2b.e2b_sandboxes, { api_key = KEY, warm = bad })
      assert.raises_code('INVALID_CONFIG', e2b_desktop.e2b_desktop_sandboxes, { api_key = KEY, warm = bad })
      assert.raises_code('INVALID_CONFIG', fly.fly_sandboxes, { token = TOKEN, app = APP, warm = bad })
      assert.raises_code('INVALID_CONFIG', daytona.daytona_sandboxes, { api_key = KEY, warm = bad })
      assert.raises_code('INVALID_CONFIG', vercel.vercel_sandboxes, { token = VERCEL.token, team_id = VERCEL.team_id,
        project_id = VERCEL.project_id, warm = bad })
      assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = RAILWAY.token,
        environment_id = RAILWAY.environment_id, warm = bad })
      assert.raises_code('INVALID_CONFIG', codesandbox.codesandbox_sandboxes, { token = CODESANDBOX, warm = bad })
      assert.raises_code('INVALID_CONFIG', cloudflare.cloudflare_sandboxes, { worker_url = 'https://w.example.dev',
        api_key = CLOUDFLARE, warm = bad })
      assert.raises_code('INVALID_CONFIG', agentcore.agentcore_sandboxes, { region = 'us-east-1', credentials = AWS,
        warm = bad })
      assert.raises_code('INVALID_CONFIG', modal.modal_sandboxes, { token_id = MODAL.token_id,
        token_secret = MODAL.token_secret, warm = bad })
      assert.raises_code('INVALID_CONFIG', northflank.northflank_sandboxes, { token = NORTHFLANK.token,
        project_id = NORTHFLANK.project_id, warm = bad })
    end
  end)
end)

for _, s in ipairs(services) do
  local describe_it = suite.describe
  if s.available and not s.available() then
    describe_it = function(name) describe(name, function() pending('its stand-in cannot run here') end) end
  end
  describe_it(s.name .. ': warm sandboxes through the kit', function()
    local svc, backing, state

    before_each(function()
      if s.start then
        svc, backing, state = s.start(), nil, nil
        return
      end
      svc = stand_in.new()
      backing = stand_in.local_backing({ max_sandboxes = 6 })
      state = s.install(svc, backing)
    end)

    after_each(function()
      if state and state.close_all then state.close_all() end
      if backing then backing:close() end
      svc:close()
    end)

    local labels = s.labels_of or labels_of

    -- the create calls' bodies, in order
    local function bodies()
      if s.create_bodies then return s.create_bodies(state, svc) end
      local out = {}
      for i, req in ipairs(svc:calls(s.create_route[1], s.create_route[2])) do out[i] = req.json or {} end
      return out
    end
    local function creates() return #bodies() end

    it('a create of the warm shape takes a ready one: no create call, its env and lifetime, a refill', function()
      local p = s.provider(svc, 2, state)
      local pool = sandbox.create_sandboxes(p, {
        max_sandboxes = 4, max_lifetime_ms = 600000, labels = { team = 'w' }, network = { s.network },
      })
      wait_for('two warm sandboxes', function() return p:warm_ready() == 2 end)
      assert.are.equal(2, creates())
      local warm_bodies = {}
      for _, b in ipairs(bodies()) do warm_bodies[#warm_bodies + 1] = b end
      -- made with the pool's labels (and the kit's create tag)
      for _, b in ipairs(warm_bodies) do
        local meta = labels(b)
        if meta then assert.are.equal('w', meta.team) end
      end

      local warm_made = p:warm_made()
      local sb = pool:create({ lifetime_ms = 60000, network = s.network, env = { WARM_ENV = 'given' },
        desktop = s.desktop })
      local made = creates()
      local claimed = false
      for _, b in ipairs(warm_made) do claimed = claimed or b == sb._backend end
      assert.is_true(claimed, 'the create took one of the warm sandboxes')
      if s.desktop then assert.are.same({ width = 800, height = 600 }, sb.desktop:size()) end
      local r = sb:exec({ 'sh', '-c', 'printf %s "$WARM_ENV"' })
      assert.are.equal(0, r.exit_code)
      assert.are.equal('given', r.stdout)
      -- the claim made no create of its own; the set refills in the background
      assert.is_true(made <= 3, 'creates: ' .. made)
      wait_for('the refill', function() return p:warm_ready() == 2 end)
      assert.are.equal(3, creates())
      if s.name == 'daytona' then
        -- Daytona was told the asked lifetime (a minute), not the warm one's
        assert.are.equal(1, #svc:calls('POST', '/api/sandbox/{id}/ttl/{minutes}'))
        assert.are.equal('1', svc:calls('POST', '/api/sandbox/{id}/ttl/{minutes}')[1].params.minutes)
      end
      if s.name == 'e2b' then
        -- E2B was told the asked lifetime, not the warm one's
        local timeouts = svc:calls('POST', '/sandboxes/{id}/timeout')
        assert.are.equal(1, #timeouts)
        assert.are.equal(60, timeouts[1].json.timeout)
      end
      sb:release()
      pool:close()
      assert.are.equal(0, s.alive(state, svc))
    end)

    it('a create of another shape is made cold; warm ones count in max_sandboxes and are evicted for it',
      function()
        local p = s.provider(svc, 2, state)
        local pool = sandbox.create_sandboxes(p, {
          max_sandboxes = 2, max_lifetime_ms = 600000, labels = { team = 'w' }, network = { s.network },
        })
        wait_for('two warm sandboxes', function() return p:warm_ready() == 2 end)
        assert.are.equal(2, p:warm_held())
        -- labels of its own: not the warm shape; every slot is warm, so one of them goes
        local other = pool:create({ lifetime_ms = 60000, network = s.network, labels = { own = 'x' } })
        assert.are.equal(3, creates())
        local body = bodies()[3]
        local meta = labels(body)
        if meta then assert.are.equal('x', meta.own) end
        assert.are.equal(1, p:warm_held())
        local warm_one = pool:create({ lifetime_ms = 60000, network = s.network })
        assert.are.equal(3, creates())
        assert.raises_code('LIMIT_EXCEEDED', pool.create, pool, { lifetime_ms = 60000, network = s.network })
        other:release()
        warm_one:release()
        pool:close()
        assert.are.equal(0, s.alive(state, svc))
        assert.are.equal(0, p:warm_held())
      end)

    it('a warm sandbox the service ended meanwhile gives way to a cold create', function()
      local p = s.provider(svc, 1, state)
      local pool = sandbox.create_sandboxes(p, {
        max_sandboxes = 3, max_lifetime_ms = 600000, labels = { team = 'w' }, network = { s.network },
      })
      wait_for('a warm sandbox', function() return p:warm_ready() == 1 end)
      local made = p:warm_made()
      assert.are.equal(1, #made)
      local res = s.kill(svc, made[1], state)
      assert.is_true(res.status >= 200 and res.status < 300, 'kill: ' .. res.status)
      local sb = pool:create({ lifetime_ms = 60000, network = s.network, env = { WARM_ENV = 'cold' } })
      assert.are_not.equal(made[1].id, sb.id)
      assert.is_true(creates() >= 2)
      local r = sb:exec({ 'sh', '-c', 'printf %s "$WARM_ENV"' })
      assert.are.equal('cold', r.stdout)
      sb:release()
      pool:close()
      assert.are.equal(0, s.alive(state, svc))
    end)
  end)
end
