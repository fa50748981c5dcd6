--- bench/embed.lua's baseline: a task that waits across the frames the game host is told to draw
-- (--frames), so each step has a timer pending and nothing else.
require('mayura').sleep(60000)
