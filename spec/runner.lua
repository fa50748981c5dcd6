-- Runs busted so that it always ends through os.exit with its verdict (see spec/helper.lua):
--   lua5.4 spec/runner.lua [busted options] [paths]
require('busted.runner')({ standalone = true })
