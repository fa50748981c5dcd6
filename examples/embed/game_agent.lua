--- The agent a game runs (examples/embed/game.c and the LÖVE game): the coding agent's recorded
-- session in a local sandbox, started as a task while the host keeps drawing its frames.
--
--   build/embed/game . examples/embed/game_agent.lua
--
-- Prints each line of progress with the frame the host was at (the global GAME_FRAME, which
-- examples/embed/game.c sets); returns whether the re-check of the agent's files passed.
local root = ... or '.'
return dofile(root .. '/examples/embed/coding_session.lua').run({
  root = root,
  print = function(line) print(string.format('[frame %d] %s', rawget(_G, 'GAME_FRAME') or 0, line)) end,
})
