--- The agent a game runs (examples/embed/game.c and the LÖVE game): the coding agent's recorded
-- session in a local sandbox, started as a task while the host keeps drawing its frames.
--
--   build/embed/game . examples/embed/game_agent.lua
--
-- Prints each line of progress; returns whether the re-check of the agent's files passed.
local root = ... or '.'
return dofile(root .. '/examples/embed/coding_session.lua').run({ root = root })
