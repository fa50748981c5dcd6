-- Per-file wall time of a spec run: at the suite's end, before busted's summary, the slowest files
-- (wall seconds, cases run, share of the run), when the run covered at least 10 files.
-- MAYURA_SPEC_TIMES=N prints the N slowest (25 if unsaid) whatever the run's size; 0 prints nothing.
-- MAYURA_SPEC_CASE_TIMES=N also prints the N slowest cases (setup and teardown not counted).
local M = {}

function M.install(busted)
  local clock = require('system').monotime
  local want = tonumber(os.getenv('MAYURA_SPEC_TIMES') or '')
  local want_cases = tonumber(os.getenv('MAYURA_SPEC_CASE_TIMES') or '') or 0
  local files, current, started = {}, nil, clock()
  local cases, case_t0 = {}, nil
  busted.subscribe({ 'file', 'start' }, function(file)
    current = { name = file.name, t0 = clock(), cases = 0 }
    return nil, true
  end)
  busted.subscribe({ 'file', 'end' }, function()
    if current then
      current.wall = clock() - current.t0
      files[#files + 1] = current
      current = nil
    end
    return nil, true
  end)
  busted.subscribe({ 'test', 'start' }, function()
    case_t0 = clock()
    return nil, true
  end)
  busted.subscribe({ 'test', 'end' }, function(element)
    if current then current.cases = current.cases + 1 end
    if want_cases > 0 and case_t0 then
      local name, ctx = { element.name }, busted.parent(element)
      while ctx and ctx.descriptor ~= 'file' do
        table.insert(name, 1, ctx.name)
        ctx = busted.parent(ctx)
      end
      cases[#cases + 1] = { wall = clock() - case_t0, name = table.concat(name, ' ') }
    end
    return nil, true
  end)
  -- priority 1: ahead of the output handler's summary, so busted's verdict stays the last line
  busted.subscribe({ 'suite', 'end' }, function()
    local n = want or (#files >= 10 and 25 or 0)
    if n <= 0 or #files == 0 then return nil, true end
    local total = clock() - started
    table.sort(files, function(a, b) return a.wall > b.wall end)
    local out = { ('\nslowest spec files (%d of %d, %.1f s in all):'):format(math.min(n, #files), #files, total) }
    for i = 1, math.min(n, #files) do
      local f = files[i]
      out[#out + 1] = ('%8.1f s %5d cases %5.1f%%  %s'):format(f.wall, f.cases, 100 * f.wall / total, f.name)
    end
    if want_cases > 0 then
      table.sort(cases, function(a, b) return a.wall > b.wall end)
      out[#out + 1] = ('slowest cases (%d of %d):'):format(math.min(want_cases, #cases), #cases)
      for i = 1, math.min(want_cases, #cases) do
        out[#out + 1] = ('%8.2f s  %s'):format(cases[i].wall, cases[i].name)
      end
    end
    io.stdout:write(table.concat(out, '\n'), '\n')
    io.stdout:flush()
    return nil, true
  end, { priority = 1 })
end

return M
