-- Call a variadic command with a fixed head and many arguments, in chunks that stay well inside
-- Lua's stack limit for unpack (about 8,000 values). With `protected`, through redis.pcall: an error (a key
-- of another type) fails that call, not the script. Returns the sum of the calls' integer replies (what
-- SREM or HDEL removed, say).
local UNPACK_CHUNK = 1000
local function call_in_chunks(command, key, values, protected)
  local caller = protected and 'pcall' or 'call'
  local total = 0
  for first = 1, #values, UNPACK_CHUNK do
    local reply = redis[caller](command, key, unpack(values, first, math.min(first + UNPACK_CHUNK - 1, #values)))
    if type(reply) == 'number' then total = total + reply end
  end
  return total
end
