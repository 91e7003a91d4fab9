--- @include "keys"
--- @include "handler_data"

-- Keep the dead set within max_jobs and max_age_ms, deleting the trimmed jobs' hashes and handler data. Bounded per
-- call so one transition never runs long; every later death trims a little more.
local TRIM_BATCH = 500
local function trim_dead(prefix, dead_key, max_jobs, max_age_ms, now)
  local victims = {}
  if max_age_ms > 0 then
    victims = redis.call('ZRANGEBYSCORE', dead_key, '-inf', '(' .. (now - max_age_ms), 'LIMIT', 0, TRIM_BATCH)
  end
  if #victims == 0 and max_jobs > 0 then
    local excess = redis.call('ZCARD', dead_key) - max_jobs
    if excess > 0 then
      victims = redis.call('ZRANGE', dead_key, 0, math.min(excess, TRIM_BATCH) - 1)
    end
  end
  if #victims > 0 then
    for _, id in ipairs(victims) do
      redis.call('DEL', job_key_of(prefix, id))
      drop_handler_data(prefix, id)
    end
    redis.call('ZREM', dead_key, unpack(victims))
  end
end
