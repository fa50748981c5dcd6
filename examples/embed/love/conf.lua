--- LÖVE 11 configuration of the example game: a small window, no audio (the game needs none).
function love.conf(t)  -- luacheck: ignore 112
  t.window.title = 'mayura in LÖVE'
  t.window.width = 640
  t.window.height = 360
  t.window.vsync = 1
  t.modules.audio = false
  t.modules.sound = false
  t.modules.joystick = false
  t.modules.physics = false
end
