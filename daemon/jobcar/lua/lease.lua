#!lua flags=allow-oom
-- lease: promote due scheduled jobs, then take up to N pending jobs and lease them to the caller.
-- Allowed under OOM: the jobs it leases are stored already; it adds a few fields and a deadline to each,
-- bounded by the caller's free slots and freed when the job ends. Without it a full server would run
-- nothing until an operator deleted keys (ADR 0008).
--
-- KEYS[1] pending    LIST
-- KEYS[2] scheduled  ZSET  id -> run-at ms
-- KEYS[3] active     ZSET  id -> lease deadline ms
-- KEYS[4] wake       LIST  cleared here once nothing is pending, so the caller can block on it
-- KEYS[5] paused     STRING present while the queue is paused
-- KEYS[6] (optional) the caller's alive key, STRING with a TTL: a lease the caller queued behind its
--         idle wait (ADR 0005) takes jobs only while that key says the caller is still alive
-- ARGV[1] the queue's key prefix
-- ARGV[2] N, the most jobs to lease (the caller's free slots)
-- ARGV[3] lease length in ms
-- ARGV[4] token base: a random string from the caller; job i of this call gets token "<base>.<i>"
-- ARGV[5] default max_attempts, stored on a job that has none of its own
-- ARGV[6] JSON object type -> max_attempts overriding ARGV[5] for those types ("{}" for none)
-- ARGV[7] dead set max jobs, ARGV[8] dead set max age ms (trimming when an expired job dies)
-- ARGV[9] (optional) JSON object type -> limit rule, the fleet-wide limits (ADR 0014): {"total": n,
--         "per_key": m, "rate": [count, period_ms], "burst": b, "key_rate": [count, period_ms],
--         "key_burst": b, "fair": true, "key": "key" | "meta.<name>" | "payload.<name>"}, each part optional
-- Pending jobs are taken by priority: `pending` (0) first, then `pending:1` to `pending:9`; FIFO within one.
-- Jobs a limit held and let go (`pending:released`, FIFO) come before all of them: they had their turn.
-- A job never started whose `expires_at` has passed is not leased: it moves to <prefix>dead (a ZSET) with
-- the reason "expired: ...".
-- A job over a limit of its type is not leased: it waits in <prefix>held:<group> in state "held" until a
-- slot of that group is given back, and the lease takes the next pending job instead (no head-of-line
-- blocking), passing over at most MAX_HELD such jobs per call; with its N leased, it goes on holding the
-- jobs at the head of the pending lists that a full limit holds back (hold ahead), up to the same bound.
-- A job over a rate limit is held the same way, and its group is put in <prefix>throttled (a ZSET group ->
-- when its next job may start), which this script reads first: the due groups' held jobs go to
-- `pending:released`, as many as may start.
-- With `fair`, a job over its type's total waits in its key's turn group instead (includes/turns.lua).
-- Touches <prefix>job:<id> HASH: state=active, attempt+1, token, started, max_attempts (if absent), slots
-- (the limit groups whose slots it took, one per line); <prefix>slots:<type> HASH (the job's id -> its key,
-- "" for a job that took no slot of a key).
-- Returns {now_ms, next_due_in_ms (-1: nothing scheduled), stopped, dropped, expired, job...}
--   stopped: 0 leased as asked, 1 the queue is paused, 2 KEYS[6] is absent (nothing was changed)
--   dropped: array of {id, why} for ids popped that are not runnable and were dropped from the list:
--            no job hash, or a key that holds another type than a hash (left for fsck), or a job whose
--            limit group's held list holds another type (moved to the dead set). A hash without a type is
--            leased like any job: the daemon moves it to the dead-letter queue as malformed.
--   expired: array of the ids moved to the dead set because their start deadline passed
--   job: {id, token, field1, value1, ...} with every field of the job hash
-- Attempts count here, at lease time: a job that kills its daemon every time still reaches the DLQ.

--- @include "now_ms"
--- @include "call_in_chunks"
--- @include "wrong_type"
--- @include "pending_key"
--- @include "pending_lists"
--- @include "move_to_dead"
--- @include "limit_groups"
--- @include "gcra"
--- @include "unpark"
--- @include "turns"

local prefix = ARGV[1]
local dead = prefix .. 'dead'
local refused = wrong_type({KEYS[1], 'list', KEYS[2], 'zset', KEYS[3], 'zset', dead, 'zset'})
if refused then return refused end

local count = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local token_base = ARGV[4]
local default_max = ARGV[5]
local max_by_type = cjson.decode(ARGV[6])
-- nil without limits: a fleet without them pays nothing for them.
local limits = ARGV[9] and ARGV[9] ~= '{}' and cjson.decode(ARGV[9]) or nil
if limits then
  -- The queue's limit keys a lease may write; a group's held list is checked where a job would be held.
  refused = wrong_type(limit_key_types(prefix))
  if refused then return refused end
end
local MAX_HELD = 1000
local now = now_ms()

local throttled = prefix .. 'throttled'

-- When the caller should lease again without a wake: the earliest scheduled job, or with limits the
-- earliest time a rate-limited group may start its next held job.
local function next_due_in()
  local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local due = head[2] and tonumber(head[2])
  if limits then
    local rated = redis.pcall('ZRANGE', throttled, 0, 0, 'WITHSCORES')
    if not rated.err and rated[2] and (not due or tonumber(rated[2]) < due) then due = tonumber(rated[2]) end
  end
  if not due then return -1 end
  return math.max(0, math.ceil(due - now))
end

if KEYS[6] and redis.call('EXISTS', KEYS[6]) == 0 then
  return {now, next_due_in(), 2, {}, {}}
end

if redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('DEL', KEYS[4])
  return {now, next_due_in(), 1, {}, {}}
end

-- Promote due scheduled jobs in run-at order, behind the jobs already pending. Bounded so that one
-- call stays short under a huge backlog of due retries; the next call promotes more.
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)
if #due > 0 then
  for _, id in ipairs(due) do
    -- An id without a hash (or whose key holds something else) is dropped, not given a stray hash; the
    -- lease reports nothing for it.
    local job_key = prefix .. 'job:' .. id
    if redis.call('TYPE', job_key).ok == 'hash' then
      redis.call('HSET', job_key, 'state', 'pending')
      redis.call('LPUSH', pending_key(KEYS[1], redis.call('HGET', job_key, 'priority')), id)
    end
  end
  redis.call('ZREM', KEYS[2], unpack(due))
end

-- Rate-limited groups whose next start is due let their held jobs go, as many as may start now; a group
-- the rules no longer limit lets them all go. Before the pending lists are read: they are leased next.
if limits then
  local groups = redis.pcall('ZRANGEBYSCORE', throttled, '-inf', now, 'LIMIT', 0, 100)
  if not groups.err and #groups > 0 then
    redis.call('ZREM', throttled, unpack(groups))
    for _, group in ipairs(groups) do
      local interval, burst = rate_of(limits, group)
      local n = MAX_HELD
      if interval and interval > 0 then
        local _, tat = gcra_wait(prefix, group, interval, burst, now)
        n = math.max(1, math.floor((now + interval * (burst - 1) - tat) / interval) + 1)
        -- Due again after those n starts, whoever takes them: a job let go that another limit holds back
        -- takes no start, and the jobs still held must not wait for the reaper's pass.
        if unpark(prefix, group, n) == n and redis.call('EXISTS', prefix .. 'held:' .. group) == 1 then
          redis.call('ZADD', throttled, 'LT', tat + n * interval - interval * (burst - 1), group)
        end
      else
        unpark(prefix, group, n)
      end
    end
  end
end

-- Set a field in an HGETALL reply `job` whose value indexes are `at` (name -> index), or append it.
local function put(job, at, name, value)
  if at[name] then
    job[at[name]] = value
  else
    job[#job + 1] = name
    job[#job + 1] = value
  end
end

-- The other lists, checked only when one exists: a queue without priorities or limits pays one EXISTS.
local lists = pending_lists(KEYS[1])
local others = redis.call('EXISTS', unpack(lists, 2))
local lease_order = {lists[#lists], unpack(lists, 1, #lists - 1)}

-- Up to `count` ids from the pending lists in lease order; a list of another type is passed over.
local function pop_by_priority(count)
  if others == 0 then return redis.call('RPOP', KEYS[1], count) or {} end
  local ids = {}
  for _, list in ipairs(lease_order) do
    if #ids >= count then break end
    if redis.call('TYPE', list).ok == 'list' then
      for _, id in ipairs(redis.call('RPOP', list, count - #ids) or {}) do ids[#ids + 1] = id end
    end
  end
  return ids
end

local reply = {now, 0, 0, {}, {}}
local started = tostring(now)
local dropped = reply[4]
local expired = reply[5]
local deadline = now + lease_ms
local leased = 0
local held = 0
local deadlines = {}  -- score, id, score, id...: one ZADD for the batch (chunks of 1,000 keep pairs whole)
local running = {}  -- type -> its slots taken, read once per call
local by_key = {}  -- type -> key -> its slots taken, read once per call and only when a key could be full
local taken = {}  -- type -> {id, key, id, key...}: the slots this call took, one HSET per type at the end
local indexed = {}  -- limit groups added to <prefix>limit_groups by this call

-- Only a group that held a job is indexed: the slots of a type whose groups never filled need no sweep (a
-- slot leaked there binds nothing until a group is full, and then its held jobs index it).
local function index_group(name)
  if not indexed[name] then
    redis.call('SADD', prefix .. 'limit_groups', name)
    indexed[name] = true
  end
end

-- A rate group with held jobs is due again at `at` (ms); an earlier time already set stays.
local function throttle(group, at)
  redis.call('ZADD', throttled, 'LT', at, group)
end

-- The first of `rates` that allows no start now, with when it will; nil, and each group's TAT, when all do.
local function throttling_group(rates)
  local tats = {}
  for i, rate in ipairs(rates) do
    local wait, tat = gcra_wait(prefix, rate[1], rate[2], rate[3], now)
    if wait > 0 then return rate[1], now + wait end
    tats[i] = tat
  end
  return nil, tats
end

-- Take a start of each rate group; a job held before (let go when its group was due) schedules the next
-- due time of its groups that still hold jobs.
local function take_starts(rates, tats, again)
  for i, rate in ipairs(rates) do
    local next_tat = gcra_take(prefix, rate[1], rate[2], tats[i], now)
    if again and redis.call('EXISTS', prefix .. 'held:' .. rate[1]) == 1 then
      throttle(rate[1], next_tat - rate[2] * (rate[3] - 1))
    end
  end
end

-- The slots of `job_type` taken: its slot hash's length, read once per call. A slot hash of another type
-- (fsck reports it) limits nothing rather than stopping the lease.
local function type_taken(job_type)
  local n = running[job_type]
  if not n then
    n = redis.pcall('HLEN', prefix .. 'slots:' .. job_type)
    if type(n) ~= 'number' then n = -math.huge end
    running[job_type] = n
  end
  return n
end

-- Whether key `key` of `job_type` has no free slot under `limit`. No key can hold more slots than its type,
-- so the keys' counts are read (one HVALS) only once the type's reach the limit: a per-key limit that
-- never binds costs no read more than the type's count.
local function key_full(job_type, key, limit)
  if type_taken(job_type) < limit then return false end
  local counts = by_key[job_type]
  if not counts then
    counts = key_counts(prefix, job_type)
    local pairs_taken = taken[job_type] or {}
    for i = 2, #pairs_taken, 2 do counts[pairs_taken[i]] = (counts[pairs_taken[i]] or 0) + 1 end
    by_key[job_type] = counts
  end
  return (counts[key] or 0) >= limit
end

-- Each limited type's rule as applied to its jobs (includes/limit_groups.lua), worked out at its first job.
local plans = {}
local function plan_of(job_type)
  local plan = plans[job_type]
  if plan == nil then
    local rule = limits[job_type]
    plan = rule and limit_plan(rule) or false
    plans[job_type] = plan
  end
  return plan
end

-- A job held before (and let go by a slot given back) is older than the group's other held jobs: it goes
-- back to the head of the list, a new one to its tail. A held list of another type (fsck reports it) cannot
-- take the job, and the script has written already: the job goes to the dead set with the reason (and is
-- reported as dropped) rather than stay in no list. It counts as held, so that one call's work stays bounded.
local function hold(job_key, id, group, again)
  local list = prefix .. 'held:' .. group
  if type(redis.pcall(again and 'RPUSH' or 'LPUSH', list, id)) ~= 'number' then
    local why = 'its limit group ' .. group .. ' cannot hold it: ' .. list .. ' holds a ' ..
      redis.call('TYPE', list).ok .. ', not a list (jobcar fsck finds it and repairs it)'
    move_to_dead(prefix, dead, job_key, id, now, why, tonumber(ARGV[7]), tonumber(ARGV[8]))
    redis.call('HDEL', job_key, 'held', 'held_at')
    dropped[#dropped + 1] = {id, why .. '; moved to the dead set'}
    held = held + 1
    return
  end
  if again then
    redis.call('HSET', job_key, 'state', 'held', 'held', group)
  else  -- `held_at` stays from the first hold until the lease: how long limits held the job, in all
    redis.call('HSET', job_key, 'state', 'held', 'held', group, 'held_at', started)
  end
  index_group(group)
  held = held + 1
end

-- A job over its type's total with keys taking turns waits for its key's turn (includes/turns.lua). The
-- total's own group is indexed too, so that the reaper's pass finds its slots and its free ones.
local function hold_for_turn(job_key, id, job_type, key, again)
  hold(job_key, id, '~' .. job_type .. '#' .. key, again)
  index_group(job_type)
  join_turns(prefix, job_type, key)
end

-- A job let go for its key's turn that another limit (its key's, a rate) holds back takes no slot of the
-- total: the turn passes to the next key, or that slot would wait for the next one given back.
local function pass_turn(rule, job_type, held_in)
  if rule.fair and held_in and string.sub(held_in, 1, 1) == '~' then next_turns(prefix, job_type, 1) end
end

-- A slot of `job_type` taken for job `id` (`key`: "" for none), after `type_taken` read the type's count.
-- The call's slots join the slot hash at its end (`add_taken`); `running` and `by_key` count them meanwhile.
local function take_slot(job_type, id, key)
  local pairs_taken = taken[job_type]
  if pairs_taken then
    pairs_taken[#pairs_taken + 1] = id
    pairs_taken[#pairs_taken + 1] = key
  else
    taken[job_type] = {id, key}
  end
  running[job_type] = running[job_type] + 1
  local counts = by_key[job_type]
  if counts then counts[key] = (counts[key] or 0) + 1 end
end

local function add_taken()
  for job_type, pairs_taken in pairs(taken) do
    call_in_chunks('HSET', prefix .. 'slots:' .. job_type, pairs_taken, true)
  end
end

-- Lease the popped job `id`, or hold it, or move it to the dead set when its start deadline passed. With
-- `hold_only`, a job that would be leased is left as it is: true when something was done with it.
local function lease_job(id, hold_only)
  local job_key = prefix .. 'job:' .. id
  -- One read and one write per job: the hash as stored, then the lease's fields. The reply is that
  -- read with the written values put in place (or appended, for fields the hash did not have).
  local job = redis.pcall('HGETALL', job_key)
  if job.err then
    dropped[#dropped + 1] = {id, 'its key holds a ' .. redis.call('TYPE', job_key).ok .. ', not a job hash'}
    return true
  elseif #job == 0 then
    dropped[#dropped + 1] = {id, 'no job hash'}
    return true
  end
  local at = {}  -- field name -> index of its value in job
  for i = 1, #job, 2 do at[job[i]] = i + 1 end
  local expires_at = at.expires_at and tonumber(job[at.expires_at])
  -- A deadline counts until the first start: a job that ran once is retried whatever the time.
  if expires_at and expires_at <= now and not tonumber(at.attempt and job[at.attempt]) then
    move_to_dead(prefix, dead, job_key, id, now, 'expired: not started by its deadline (' ..
      (now - expires_at) .. ' ms ago)', tonumber(ARGV[7]), tonumber(ARGV[8]))
    expired[#expired + 1] = id
    return true
  end
  local job_type = job[at.type]
  local plan = limits and job_type and plan_of(job_type)
  if hold_only and not plan then return false end
  local slots
  if plan then
    local rule = plan.rule
    local key = plan.key_field and read_key(plan.key_field, plan.key_name, job, at)
    -- A job takes one slot of its type, which counts in its type's total and in its key's group: their names,
    -- one per line, are its `slots`.
    local key_group = key and rule.per_key and job_type .. '#' .. key
    if rule.total and type_taken(job_type) >= rule.total then
      if rule.fair then
        hold_for_turn(job_key, id, job_type, key or '', at.held)
      else
        hold(job_key, id, job_type, at.held)
      end
      return true
    elseif key_group and key_full(job_type, key, rule.per_key) then
      pass_turn(rule, job_type, at.held and job[at.held])
      hold(job_key, id, key_group, at.held)
      return true
    end
    if plan.rated then
      local rates = rate_groups(rule, job_type, key)
      local rated, due_or_tats = throttling_group(rates)
      if rated then
        pass_turn(rule, job_type, at.held and job[at.held])
        hold(job_key, id, rated, at.held)
        throttle(rated, due_or_tats)
        return true
      end
      if hold_only then return false end
      local tats = due_or_tats
      take_starts(rates, tats, at.held)
    end
    if hold_only then return false end
    if key_group then
      take_slot(job_type, id, key)
      slots = rule.total and job_type .. '\n' .. key_group or key_group
    elseif rule.total then
      take_slot(job_type, id, '')
      slots = job_type
    end
  end
  leased = leased + 1
  local token = token_base .. '.' .. leased
  -- An attempt count that is not a number (a hash written by hand) counts as none.
  local attempt = tostring((tonumber(at.attempt and job[at.attempt]) or 0) + 1)
  put(job, at, 'state', 'active')
  put(job, at, 'token', token)
  put(job, at, 'started', started)
  put(job, at, 'attempt', attempt)
  -- The job's first lease stores its max_attempts; a limited job's lease its slots (no table built for the
  -- others: this runs for every job).
  local max_attempts = nil
  if not at.max_attempts then
    max_attempts = tostring(max_by_type[job[at.type]] or default_max)
    put(job, at, 'max_attempts', max_attempts)
  end
  if slots then
    redis.call('HSET', job_key, 'state', 'active', 'token', token, 'started', started, 'attempt', attempt,
      'slots', slots, 'max_attempts', max_attempts or job[at.max_attempts])
  elseif max_attempts then
    redis.call('HSET', job_key, 'state', 'active', 'token', token, 'started', started, 'attempt', attempt,
      'max_attempts', max_attempts)
  else
    redis.call('HSET', job_key, 'state', 'active', 'token', token, 'started', started, 'attempt', attempt)
  end
  if at.held then redis.call('HDEL', job_key, 'held', 'held_at') end
  deadlines[#deadlines + 1] = deadline
  deadlines[#deadlines + 1] = id
  table.insert(job, 1, token)
  table.insert(job, 1, id)
  reply[#reply + 1] = job
end

-- Without limits one pass, as asked; with them, more passes while jobs were held back instead of leased.
if count > 0 then
  repeat
    local ids = pop_by_priority(count - leased)
    for _, id in ipairs(ids) do lease_job(id) end
  until #ids == 0 or leased >= count or not limits or held >= MAX_HELD
end

-- Hold ahead: with the caller's slots all taken, jobs over a full limit at the head of the pending lists
-- would stand in front of the jobs behind them until the next lease. They are held now (a key's backlog
-- reaches its turns, or its limit's list, at up to MAX_HELD jobs a call, whatever the caller's slots), and
-- the first job that would be leased stays where it is.
local function hold_ahead()
  for _, list in ipairs(others == 0 and {KEYS[1]} or lease_order) do
    if redis.call('TYPE', list).ok == 'list' then
      while held < MAX_HELD do
        local id = redis.call('LINDEX', list, -1)
        if not id then break end
        if not lease_job(id, true) then return end
        redis.call('RPOP', list)
      end
      if held >= MAX_HELD then return end
    end
  end
end
-- Only while limits bind (a group held a job lately): limits that never do cost no read more per call.
if limits and leased >= count and held < MAX_HELD
    and (held > 0 or redis.call('EXISTS', prefix .. 'limit_groups') == 1) then
  hold_ahead()
end

call_in_chunks('ZADD', KEYS[3], deadlines)
add_taken()
if redis.call('LLEN', KEYS[1]) == 0 and (others == 0 or redis.call('EXISTS', unpack(lists, 2)) == 0) then
  redis.call('DEL', KEYS[4])
end
reply[2] = next_due_in()
return reply
