--- A recorded session of the web agent (examples/web_agent.lua), as data: the model's steps.
--
--   local session = dofile('examples/sessions/web_page.lua')
--   local model = require('mayura.testing').scripted_model(session.steps, { max_cost_micros = 40000 })
--
-- Written by hand in the shape of a real session: the model downloads the
-- package `greet` from the registry its sandbox may reach (the only name on
-- its allow-list), unpacks it, tries a name that is not on the list (and sees
-- the proxy refuse it), renders a page with the package's program, serves it
-- on port 8080, asks for the page's URL and answers with it.
--
-- The steps after a command are functions: they read the command's real
-- result in `request.messages` and raise when it is not what the session
-- expects (the sandbox, its proxy and the tools are real), so the session
-- cannot claim an install or a refusal that did not happen.
--
-- Returns `{ task = ..., steps = { ... }, registry = name, package = { ... } }`: `package` is
-- what the registry stand-in serves (the files of greet-1.0.0.tgz).

local REGISTRY = 'packages.example.com'
local TASK = 'Install the package greet 1.0.0 from ' .. REGISTRY .. ', use it to make a page that greets the'
  .. ' visitor, serve it on port 8080 and give me its URL.'

-- The package: a program that writes a greeting page, and its page template.
local PACKAGE = {
  { name = 'greet/bin/greet', mode = 493, data = '#!/bin/sh\n'
    .. 'sed "s/@NAME@/$1/g" "$(dirname "$0")/../share/page.html"\n' },
  { name = 'greet/share/page.html', data = '<!doctype html>\n<title>greet</title>\n<h1>Hello, @NAME@!</h1>\n' },
}

local function exec(id, command)
  return { id = id, tool_id = 'workspace.exec', input = { command = command } }
end

local function calls(cost, list)
  return { type = 'tool_calls', usage = { cost_micros = cost }, calls = list }
end

local function fail(message)
  error('the recorded session expected ' .. message, 0)
end

-- The result of the one call of the last step.
local function last_result(request, tool_id)
  local m = request.messages[#request.messages]
  if not m or m.role ~= 'tool' or m.tool_id ~= tool_id or type(m.result) ~= 'table' then
    fail('the result of one ' .. tool_id .. ' call')
  end
  if m.result.error then fail(tool_id .. ' to succeed, but: ' .. tostring(m.result.error.message)) end
  return m.result
end

local steps = {
  -- 1. Fetch the package through the proxy (wget reads http_proxy) and unpack it.
  calls(1500, {
    exec('c1', 'busybox wget -q -O /tmp/greet.tgz http://' .. REGISTRY .. '/greet-1.0.0.tgz'
      .. ' && mkdir -p /workspace/pkg && tar -xzf /tmp/greet.tgz -C /workspace/pkg && ls /workspace/pkg/greet/bin'),
  }),

  -- 2. It is there. Try a mirror that is not on the allow-list.
  function(request)
    local r = last_result(request, 'workspace.exec')
    if r.exit_code ~= 0 or not (r.stdout or ''):find('greet', 1, true) then
      fail('the package to install, but: ' .. tostring(r.stderr))
    end
    return calls(900, { exec('c2', 'busybox wget -q -O - http://mirror.example.net/greet-1.0.0.tgz; echo "exit $?"') })
  end,

  -- 3. Refused (the proxy answers 403). Render the page and serve it.
  function(request)
    local r = last_result(request, 'workspace.exec')
    if (r.stdout or ''):find('exit 0', 1, true) then fail('the mirror to be refused, but it answered') end
    return calls(1300, {
      exec('c3', 'mkdir -p /workspace/site && /workspace/pkg/greet/bin/greet visitor > /workspace/site/index.html'
        .. ' && busybox httpd -p 8080 -h /workspace/site </dev/null >/dev/null 2>&1 && echo serving'),
    })
  end,

  -- 4. Ask for the URL of port 8080.
  function(request)
    local r = last_result(request, 'workspace.exec')
    if r.exit_code ~= 0 then fail('the server to start, but: ' .. tostring(r.stderr)) end
    return calls(700, { { id = 'c4', tool_id = 'workspace.url', input = { port = 8080 } } })
  end,

  -- 5. Answer with it.
  function(request)
    local r = last_result(request, 'workspace.url')
    if type(r.url) ~= 'string' then fail('a URL') end
    return {
      type = 'final',
      usage = { cost_micros = 1100 },
      output = {
        summary = 'Installed greet 1.0.0 from ' .. REGISTRY .. ' (a mirror off the allow-list was refused),'
          .. ' rendered a greeting page with it and serve it on port 8080.',
        url = r.url,
      },
    }
  end,
}

return { task = TASK, steps = steps, registry = REGISTRY, package = PACKAGE }
