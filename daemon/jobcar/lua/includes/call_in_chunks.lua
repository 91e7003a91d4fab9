-- Call a variadic command with a fixed head and many arguments, in chunks that stay well inside
-- Lua's stack limit for unpack (about 8,000 values). `call` is redis.call unless given (redis.pcall).
local UNPACK_CHUNK = 1000
local function call_in_chunks(command, key, values, call)
  call = call or redis.call
  for first = 1, #values, UNPACK_CHUNK do
    call(command, key, unpack(values, first, math.min(first + UNPACK_CHUNK - 1, #values)))
  end
end
