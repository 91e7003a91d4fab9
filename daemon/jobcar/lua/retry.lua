#!lua flags=allow-oom
-- retry: give back a leased job that failed, to run again after a delay, or to the DLQ once its
-- attempts are spent.
--
-- KEYS[1] active     ZSET
-- KEYS[2] pending    LIST
-- KEYS[3] scheduled  ZSET  id -> run-at ms
-- KEYS[4] dead       ZSET  id -> died-at ms
-- KEYS[5] wake       LIST
-- KEYS[6] job        HASH  <prefix>job:<id>
-- ARGV[1] the queue's key prefix
-- ARGV[2] id
-- ARGV[3] lease token
-- ARGV[4] delay in ms before the next attempt (0: pending now)
-- ARGV[5] error text, recorded in the job's error history
-- ARGV[6] "1" spends the attempt; "0" gives it back (the handler only asked for a later slot:
--         HTTP 429/503 with Retry-After, or the daemon is draining)
-- ARGV[7] dead set max jobs, ARGV[8] dead set max age ms (trimming when the job dies)
-- ARGV[9] how many attempts a job may give back in its life ("0": no limit); past it, a give-back
--         spends the attempt after all, so a handler answering 429 forever cannot park a job forever
-- ARGV[10] (optional) "type" or "key": a handler's 429 holds the job's type, or its key, back for the
--         delay (limits.on_429, ADR 0014): the rate group's TAT moves to now + delay + ARGV[12], so no
--         job of the group starts before then; ARGV[11] where the key comes from (as the lease's rules),
--         ARGV[12] the group's rate interval × (burst - 1) in ms ("0" without a rate)
-- Touches <prefix>job:<id> HASH (errors, attempt, deferrals, state, run_at), the job's limit slots (given
-- back: includes/release_slots.lua).
-- Returns 1 retried (scheduled or pending), 2 attempts spent: moved to dead, 3 the same and jobs waited for it
-- (their entry is in <prefix>settled: the caller settles them now), 0 lease lost (nothing changed).
-- A job others wait for that would die while <prefix>settled holds another type is refused
-- (includes/tell_dependents.lua, untold_refusal): nothing changed, and the reply names the key.

--- @include "keys"
--- @include "now_ms"
--- @include "record_error"
--- @include "wake"
--- @include "holds_lease"
--- @include "move_to_pending"
--- @include "move_to_dead"
--- @include "wrong_type"
--- @include "release_slots"
--- @include "limit_groups"
--- @include "group_names"

local refused = wrong_type({KEYS[1], 'zset', KEYS[2], 'list', KEYS[3], 'zset', KEYS[4], 'zset'})
if refused then return refused end

local prefix, id, token = ARGV[1], ARGV[2], ARGV[3]
local delay = tonumber(ARGV[4])
local job_key = KEYS[6]
local held, fields = holds_lease(job_key, token, 'attempt', 'max_attempts', 'deferrals', 'slots', 'dependents')
if not held then return 0 end

local now = now_ms()
-- Read everything before the first write: a script that fails half-way keeps its writes.
local attempt = tonumber(fields[3] or '0') or 0
local max_attempts = tonumber(fields[4] or '1') or 1
local max_free = tonumber(ARGV[9])
-- A give-back past the job's free ones spends the attempt after all (counted below, in `deferrals`).
local gives_back = ARGV[6] ~= '1'
local spend = not gives_back or (max_free > 0 and (tonumber(fields[5] or '0') or 0) + 1 > max_free)
local dies = spend and attempt >= max_attempts
if dies then
  -- A job others wait for does not die while it could not tell them.
  refused = untold_refusal(prefix, fields[7])
  if refused then return refused end
end
local hold_group = nil
if ARGV[10] and ARGV[10] ~= '' and delay > 0 then
  local job = redis.call('HGETALL', job_key)
  local at = {}
  for i = 1, #job, 2 do at[job[i]] = i + 1 end
  local job_type = job[at.type]
  hold_group = job_type and rate_group(job_type)
  if hold_group and ARGV[10] == 'key' then
    local key = limit_key(ARGV[11], job, at)
    hold_group = key and key_rate_group(job_type, key)  -- a job without a key holds back only itself
  end
end
redis.call('ZREM', KEYS[1], id)
release_slots(prefix, id, fields[6])
if gives_back and max_free > 0 then redis.call('HINCRBY', job_key, 'deferrals', 1) end
if dies then
  local reason = ARGV[5] .. ' (attempts exhausted: ' .. attempt .. ' of ' .. max_attempts .. ')'
  local left = move_to_dead(prefix, KEYS[4], job_key, id, now, reason, tonumber(ARGV[7]), tonumber(ARGV[8]))
  return left and 3 or 2
end

record_error(job_key, attempt, now, ARGV[5])
if hold_group then
  local tat_key = tat_key_of(prefix, hold_group)
  local until_tat = now + delay + tonumber(ARGV[12])
  local stored = redis.pcall('GET', tat_key)
  if not (type(stored) == 'string' and (tonumber(stored) or 0) >= until_tat) then
    redis.call('SET', tat_key, string.format('%.3f', until_tat), 'PX', math.max(1, math.ceil(until_tat - now)))
  end
end
if not spend then redis.call('HINCRBY', job_key, 'attempt', -1) end
redis.call('HDEL', job_key, 'token', 'started', 'slots')
if delay > 0 then
  local run_at = now + delay
  redis.call('HSET', job_key, 'state', 'scheduled', 'run_at', run_at)
  redis.call('ZADD', KEYS[3], run_at, id)
  if redis.call('ZRANGE', KEYS[3], 0, 0)[1] == id then wake(KEYS[5]) end
else
  redis.call('HSET', job_key, 'run_at', now)
  move_to_pending(prefix, job_key, KEYS[2], id)
  wake(KEYS[5])
end
return 1
