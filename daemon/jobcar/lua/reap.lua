#!lua flags=allow-oom
-- reap: recover jobs whose lease expired (their daemon died, stalled or lost Redis): back to
-- pending, or to the DLQ when their attempts are spent.
--
-- KEYS[1] active   ZSET  id -> lease deadline ms
-- KEYS[2] pending  LIST
-- KEYS[3] dead     ZSET
-- KEYS[4] wake     LIST
-- ARGV[1] the queue's key prefix
-- ARGV[2] the most jobs to reap in this call
-- ARGV[3] dead set max jobs, ARGV[4] dead set max age ms
-- ARGV[5] default max_attempts for a job that has none stored
-- ARGV[6] (optional) the limits as the lease takes them (JSON type -> rule, ADR 0014): the slot hash of
--         each type with a group in <prefix>limit_groups drops the slots of jobs no longer active (a job hash
--         deleted while it ran), and each group lets held jobs go back to pending up to its free slots, all
--         of them when the config has no limit for the group any more; a rate group still limited is put in
--         <prefix>throttled if it is missing there; a key's turn group (`fair`) is put back in its type's
--         turns if it is missing there
-- Returns {next_expiry_in_ms, {id, result, id, result...}}: the time until the earliest lease left in the
-- active set expires (-1: none; 0: more expired than this call's limit), so the caller can sleep until
-- exactly then; result is "pending", "dead" or "missing" (an id in the active set without a job hash:
-- removed from the set and reported). A reaped job's limit slots are given back.
-- A pass that would move to the dead set a job others wait for while <prefix>settled holds another type is
-- refused whole, before its first write (the reply names the key).
-- State and deadline are read inside this script, at Redis time, so a job acked or renewed a moment
-- ago is never reaped, and two reapers running at once cannot recover the same lease twice.

--- @include "keys"
--- @include "now_ms"
--- @include "record_error"
--- @include "wake"
--- @include "move_to_pending"
--- @include "move_to_dead"
--- @include "tell_dependents"
--- @include "wrong_type"
--- @include "release_slots"
--- @include "turns"
--- @include "gcra"
--- @include "group_names"

local prefix = ARGV[1]
local refused = wrong_type({KEYS[1], 'zset', KEYS[2], 'list', KEYS[3], 'zset'})
  -- with limits, the limit keys the pass writes too
  or (ARGV[6] and wrong_type(limit_key_types(prefix)))
if refused then return refused end

local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[2]))
-- Every expired job read before the first write: one that dies here while others wait for it, with
-- <prefix>settled of another type, refuses the whole pass (includes/tell_dependents.lua, untold_refusal)
-- rather than end it without telling them; its lease is reaped once fsck repaired the key.
local read, checked = {}, false
for n, id in ipairs(expired) do
  local fields = redis.pcall('HMGET', job_key_of(prefix, id), 'type', 'attempt', 'max_attempts', 'slots',
    'dependents')
  read[n] = fields
  if not fields.err and fields[1] and fields[5] and not checked then
    local attempt = tonumber(fields[2] or '0') or 0
    if attempt >= (tonumber(fields[3] or ARGV[5]) or tonumber(ARGV[5])) then
      refused = untold_refusal(prefix, fields[5])
      if refused then return refused end
      checked = true
    end
  end
end
local reply = {}
local requeued = false
for n, id in ipairs(expired) do
  local job_key = job_key_of(prefix, id)
  redis.call('ZREM', KEYS[1], id)
  local fields = read[n]
  local result
  if fields.err then
    result = 'missing'  -- its key holds something else than a job: the id leaves the set, fsck reports the key
  elseif not fields[1] then
    result = 'missing'
  else
    release_slots(prefix, id, fields[4])
    local attempt = tonumber(fields[2] or '0') or 0
    local max_attempts = tonumber(fields[3] or ARGV[5]) or tonumber(ARGV[5])
    if attempt >= max_attempts then
      local reason = 'lease expired: the daemon running attempt ' .. attempt ..
        ' stopped renewing it (attempts exhausted: ' .. attempt .. ' of ' .. max_attempts .. ')'
      move_to_dead(prefix, KEYS[3], job_key, id, now, reason, tonumber(ARGV[3]), tonumber(ARGV[4]))
      result = 'dead'
    else
      record_error(job_key, attempt, now, 'lease expired: the daemon running attempt ' .. attempt ..
        ' stopped renewing it')
      redis.call('HSET', job_key, 'run_at', now)
      move_to_pending(prefix, job_key, KEYS[2], id)
      requeued = true
      result = 'pending'
    end
  end
  reply[#reply + 1] = id
  reply[#reply + 1] = result
end
if requeued then wake(KEYS[4]) end

-- The held jobs' safety net: slots lost with a job's hash come back, and a limit raised or removed in the
-- config lets its held jobs go (a release frees one at a time).
local MAX_UNPARKED = 1000
local limits = ARGV[6] and cjson.decode(ARGV[6])
if limits then
  local groups = redis.pcall('SMEMBERS', limit_groups_key_of(prefix))
  if groups.err then groups = {} end
  -- type -> {total = its slots taken, by_key = key -> its slots taken}, once the pass dropped the slots of
  -- jobs no longer active from its slot hash: read once per type, whichever of its groups comes first.
  local swept = {}
  local function slots_of(job_type)
    local counts = swept[job_type]
    if counts then return counts end
    counts = {total = 0, by_key = {}}
    local slots = slots_key_of(prefix, job_type)
    local entries = redis.pcall('HGETALL', slots)
    if entries.err then entries = {} end
    for i = 1, #entries, 2 do
      local id, key = entries[i], entries[i + 1]
      if redis.pcall('HGET', job_key_of(prefix, id), 'state') == 'active' then
        counts.total = counts.total + 1
        counts.by_key[key] = (counts.by_key[key] or 0) + 1
      else
        redis.call('HDEL', slots, id)
      end
    end
    swept[job_type] = counts
    return counts
  end
  for _, group in ipairs(groups) do
    local kind, job_type, key = group_parts(group)
    local taken = nil
    if kind == 'rate' then
      -- Still rate-limited: its held jobs go when the lease finds the group due; a group that holds jobs
      -- but is missing from the throttled ZSET is due now. No longer limited: they all go.
      if not rate_of(limits, group) then
        unpark(prefix, group, MAX_UNPARKED)
      elseif redis.call('EXISTS', held_key_of(prefix, group)) == 1 then
        redis.call('ZADD', throttled_key_of(prefix), 'NX', now, group)
      end
    elseif kind == 'turn' then
      -- A key's turn group: its jobs go in turn while the type is fair, all at once once it is not.
      local rule = key and limits[job_type]
      if not (rule and rule.fair and rule.total) then
        unpark(prefix, group, MAX_UNPARKED)
      elseif redis.call('EXISTS', held_key_of(prefix, group)) == 1 then
        join_turns(prefix, job_type, key)
        redis.call('SADD', limit_groups_key_of(prefix), job_type)
      end
    else
      local counts = slots_of(job_type)
      taken = key and (counts.by_key[key] or 0) or counts.total
      local rule = limits[job_type]
      local limit = rule and (key and rule.per_key or (not key and rule.total)) or nil
      local free = MAX_UNPARKED
      if limit then free = math.min(free, limit - taken) end
      if free > 0 then let_go(prefix, group, free) end
    end
    forget_idle_group(prefix, group, taken)
  end
end
local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_expiry_in = -1
if #earliest > 0 then next_expiry_in = math.max(0, tonumber(earliest[2]) - now) end
return {next_expiry_in, reply}
