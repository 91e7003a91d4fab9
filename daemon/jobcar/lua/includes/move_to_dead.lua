--- @include "record_error"
--- @include "release_unique"
--- @include "count_in_batch"
--- @include "trim_dead"
--- @include "tell_dependents"

-- Move a job (already removed from its previous set) to the dead-letter set; the jobs waiting for it are told.
-- True when that left an entry for the daemons to carry (includes/tell_dependents.lua).
local function move_to_dead(prefix, dead_key, job_key, id, now, reason, dead_max, dead_age_ms)
  local attempt = tonumber(redis.call('HGET', job_key, 'attempt') or '0')
  record_error(job_key, attempt, now, reason)
  redis.call('HSET', job_key, 'state', 'dead', 'finished', now)
  redis.call('HDEL', job_key, 'token', 'cancel', 'slots')
  redis.call('ZADD', dead_key, now, id)
  release_unique(prefix, job_key, id)
  count_in_batch(prefix, job_key, 'dead', 1)
  local left = tell_dependents(prefix, job_key, id, 'dead')
  trim_dead(prefix, dead_key, dead_max, dead_age_ms, now)
  return left
end
