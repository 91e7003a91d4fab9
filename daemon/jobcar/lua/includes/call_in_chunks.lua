-- Call a variadic command with a fixed head and many arguments, in chunks that stay well inside
-- Lua's stack limit for unpack (about 8,000 values). With `protected`, through redis.pcall: an error (a key
-- of another type) fails that call, not the script.
local UNPACK_CHUNK = 1000
local function call_in_chunks(command, key, values, protected)
  local caller = protected and 'pcall' or 'call'
  for first = 1, #values, UNPACK_CHUNK do
    redis[caller](command, key, unpack(values, first, math.min(first + UNPACK_CHUNK - 1, #values)))
  end
end
