-- True when the server holds more than its maxmemory: a script allowed to run out of memory (allow-oom)
-- then adds nothing it can do without (a job's result). INFO is read once per script call, and only when
-- asked: most calls never store anything that grows. A user whose ACL forbids INFO (the documented rule
-- allows it) is never told the server is full: the script then keeps what it would have kept anyway.
local memory_is_full
local function out_of_memory()
  if memory_is_full == nil then
    local info = redis.pcall('INFO', 'memory')
    if type(info) ~= 'string' then
      memory_is_full = false
    else
      local used = tonumber(string.match(info, 'used_memory:(%d+)'))
      local limit = tonumber(string.match(info, 'maxmemory:(%d+)'))
      memory_is_full = limit ~= nil and limit > 0 and used ~= nil and used > limit
    end
  end
  return memory_is_full
end
