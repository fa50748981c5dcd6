-- core.report_once: a warning about this machine is said once per Lua state, even when a runner
-- reloads the modules that say it between spec files.
local core = require('mayura.core')
local util = require('support.util')

describe('core.report_once', function()
  it('reports a text the first time only, across a reload of the core module', function()
    local text = 'a warning of this spec, ' .. tostring(math.random(1, 1e9))
    local first, second, third
    local reports = util.capture_reports(function()
      first = core.report_once(text)
      second = core.report_once(text)
      package.loaded['mayura.core'] = nil
      local again = require('mayura.core')
      package.loaded['mayura.core'] = core
      third = again.report_once(text)
      again.report_once(text .. ' (another)')
    end)
    assert.are.same({ true, false, false }, { first, second, third })
    assert.are.same({ text, text .. ' (another)' }, reports)
    assert.has_error(function() core.report_once(nil) end)
  end)
end)
