-- _lib.lua: helpers shared by every transition. store.py inserts this file right after each
-- script's shebang line, so a script is still a single, self-contained EVAL body.
--
-- Key layout (docs/protocol.md): every key of a queue starts with the queue's prefix
-- "<ns>:{<queue>}:" (ARGV[1] of every script), so all keys of a queue hash to one Cluster slot and
-- scripts may build job, unique-lock and batch keys from it without crossing slots.

-- Redis time in integer milliseconds: the only clock jobcar trusts (no skew between hosts).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Append one entry to the job's bounded error history (a JSON array in the "errors" field).
local MAX_ERRORS_KEPT = 20
local function record_error(job_key, attempt, now, message)
  local raw = redis.call('HGET', job_key, 'errors')
  local errors = {}
  if raw then errors = cjson.decode(raw) end
  errors[#errors + 1] = {attempt = attempt, at = now, error = message}
  while #errors > MAX_ERRORS_KEPT do table.remove(errors, 1) end
  redis.call('HSET', job_key, 'errors', cjson.encode(errors))
end

-- Drop a job's unique lock, but only while it still points at this job (it may have expired and
-- been taken by a newer job with the same key).
local function release_lock(prefix, unique, id)
  local lock = prefix .. 'unique:' .. unique
  if redis.call('GET', lock) == id then redis.call('DEL', lock) end
end

local function release_unique(prefix, job_key, id)
  local unique = redis.call('HGET', job_key, 'unique')
  if unique then release_lock(prefix, unique, id) end
end

-- Count an outcome in the job's batch, if it belongs to one (Spark producers wait on these).
local BATCH_TTL_MS = 7 * 86400 * 1000
local function add_to_batch(prefix, batch, field, by)
  local key = prefix .. 'batch:' .. batch
  redis.call('HINCRBY', key, field, by)
  redis.call('PEXPIRE', key, BATCH_TTL_MS)
end

local function count_in_batch(prefix, job_key, field, by)
  local batch = redis.call('HGET', job_key, 'batch')
  if batch then add_to_batch(prefix, batch, field, by) end
end

-- Call a variadic command with a fixed head and many arguments, in chunks that stay well inside
-- Lua's stack limit for unpack (about 8,000 values).
local UNPACK_CHUNK = 1000
local function call_in_chunks(command, key, values)
  for first = 1, #values, UNPACK_CHUNK do
    redis.call(command, key, unpack(values, first, math.min(first + UNPACK_CHUNK - 1, #values)))
  end
end

-- Wake daemons blocked on the queue (they wait with BLMOVE wake wake, which does not consume it).
local function wake(wake_key)
  if redis.call('EXISTS', wake_key) == 0 then redis.call('RPUSH', wake_key, '1') end
end

-- Keep the dead set within max_jobs and max_age_ms, deleting the trimmed jobs' hashes. Bounded per
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
    for _, id in ipairs(victims) do redis.call('DEL', prefix .. 'job:' .. id) end
    redis.call('ZREM', dead_key, unpack(victims))
  end
end

-- Move a job (already removed from its previous set) to the dead-letter set.
local function move_to_dead(prefix, dead_key, job_key, id, now, reason, dead_max, dead_age_ms)
  local attempt = tonumber(redis.call('HGET', job_key, 'attempt') or '0')
  record_error(job_key, attempt, now, reason)
  redis.call('HSET', job_key, 'state', 'dead', 'finished', now)
  redis.call('HDEL', job_key, 'token', 'cancel')
  redis.call('ZADD', dead_key, now, id)
  release_unique(prefix, job_key, id)
  count_in_batch(prefix, job_key, 'dead', 1)
  trim_dead(prefix, dead_key, dead_max, dead_age_ms, now)
end

-- Put a job (already removed from its previous set) back at the tail of the pending list.
local function move_to_pending(job_key, pending_key, id)
  redis.call('HSET', job_key, 'state', 'pending')
  redis.call('HDEL', job_key, 'token', 'started')
  redis.call('LPUSH', pending_key, id)
end

-- True when the caller still holds the lease: the job is active and carries the caller's token.
-- The hash is the truth; the active set only indexes deadlines for the reaper. Every script that
-- takes a lease away (reap, another lease after it) changes state or token in the same step, so a
-- matching token proves nobody else acted, even if the job's entry in the active set vanished
-- (an operator's ZREM, a bug): extend then restores the entry instead of losing the job.
-- Callers that need more of the hash name those fields: their values come back second (after state
-- and token), read by the same HMGET.
local function holds_lease(job_key, token, ...)
  local fields = redis.call('HMGET', job_key, 'state', 'token', ...)
  return fields[1] == 'active' and fields[2] == token, fields
end
