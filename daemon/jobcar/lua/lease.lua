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
-- An idle queue costs one EXISTS after TIME (and the alive key's EXISTS): an idle daemon sends this call per
-- queue every IDLE_WAIT_MAX (ADR 0022). Keys of the wrong type are refused as ever (includes/wrong_type.lua)
-- before the first write: `pending` and `scheduled` by their first read, the others just before the first
-- write; a call that writes nothing but the deletion of `wake` checks none of them.

--- @include "keys"
--- @include "now_ms"
--- @include "call_in_chunks"
--- @include "wrong_type"
--- @include "pending_key"
--- @include "pending_lists"
--- @include "move_to_dead"
--- @include "lease_limits"
--- @include "count_pending"

local prefix = ARGV[1]
local dead = dead_key_of(prefix)
local count = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local token_base = ARGV[4]
local default_max = ARGV[5]
-- nil without limits: a fleet without them pays nothing for them.
local limits = ARGV[9] and ARGV[9] ~= '{}' and cjson.decode(ARGV[9]) or nil
local now = now_ms()
local lists = pending_lists(KEYS[1])

-- The refusal naming a key of the wrong type (ADR 0008), from the pair `from` on of the keys the lease
-- writes, then the limit keys. The reads of `pending` and `scheduled` fail on another type before any write
-- and ask for all of them (the same refusal as ever); the others are checked just before the first write.
-- A call that writes nothing checks nothing (ADR 0022): it takes nothing, whatever the other keys hold.
local function refusal(from)
  local expected = {KEYS[1], 'list', KEYS[2], 'zset', KEYS[3], 'zset', dead, 'zset'}
  if limits then
    for _, part in ipairs(limit_key_types(prefix)) do expected[#expected + 1] = part end
  end
  return wrong_type({unpack(expected, from)})
end

-- The earliest scheduled job's run-at (ms, or nil), read once for both the due check and the reply's
-- next_due_in_ms; or the refusal when `scheduled` holds another type.
local function earliest()
  local head = redis.pcall('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if head.err then return nil, refusal(1) or head end
  return head[2] and tonumber(head[2])
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

local reply = {now, 0, 0, {}, {}}
local started = tostring(now)
local dropped = reply[4]
local expired = reply[5]
local deadline = now + lease_ms
local leased = 0
local deadlines = {}  -- score, id, score, id...: one ZADD for the batch (chunks of 1,000 keep pairs whole)
-- type -> how many of its jobs this call made pending (promoted) less those it took out of the pending and
-- held lists (leased, expired, moved to the dead set): one HINCRBY per type at the end (includes/count_pending.lua)
local counted = {}
local function tally(job_type, n)
  job_type = job_type or ''
  counted[job_type] = (counted[job_type] or 0) + n
end

-- A job a limit would hold whose group's held list holds another type (fsck reports it): the script has
-- written already, so the job goes to the dead set with the reason (and is reported as dropped) rather than
-- stay in no list.
local function cannot_hold(job_key, id, why)
  local f = redis.call('HMGET', job_key, 'state', 'type')
  if is_counted(f[1]) then tally(f[2], -1) end
  move_to_dead(prefix, dead, job_key, id, now, why, tonumber(ARGV[7]), tonumber(ARGV[8]))
  redis.call('HDEL', job_key, 'held', 'held_at')
  dropped[#dropped + 1] = {id, why .. '; moved to the dead set'}
end
local limiter = limits and lease_limits(prefix, limits, now, started, cannot_hold)

-- When the caller should lease again without a wake: at `due` (the earliest scheduled job, ms, or nil), or
-- with limits at the earliest time a rate-limited group may start its next held job, if sooner.
local function next_due_in(due)
  if limiter then due = limiter.next_start(due) end
  if not due then return -1 end
  return math.max(0, math.ceil(due - now))
end

if KEYS[6] and redis.call('EXISTS', KEYS[6]) == 0 then
  local due, refused = earliest()
  if refused then return refused end
  return {now, next_due_in(due), 2, {}, {}}
end

-- An idle queue (nothing in any pending list, nothing scheduled, not paused, no wake to delete, no rate group
-- to let go) is answered by one EXISTS: an idle daemon sends this call every IDLE_WAIT_MAX per queue.
local look = {KEYS[1], KEYS[4], KEYS[2], KEYS[5], unpack(lists, 2)}
if limits then look[#look + 1] = throttled_key_of(prefix) end
local found = redis.call('EXISTS', unpack(look))
if found == 0 then return {now, -1, 0, {}, {}} end

-- `pending` by a read that fails on another type; then what else `look` found, told apart only while some
-- of it is left unexplained: a job that arrives on a queue with nothing else but its wake is leased
-- without reading the schedule, the pause or the other lists.
local queued = redis.pcall('LLEN', KEYS[1])
if type(queued) == 'table' then return refusal(1) or queued end
if queued > 0 then found = found - 1 end
if found > 0 then found = found - redis.call('EXISTS', KEYS[4]) end
local first_due, refused, others = nil, nil, 0
if found > 0 then
  first_due, refused = earliest()
  if refused then return refused end
  if redis.call('EXISTS', KEYS[5]) == 1 then
    redis.call('DEL', KEYS[4])
    return {now, next_due_in(first_due), 1, {}, {}}
  end
  if first_due then found = found - 1 end
  -- The other lists (or `throttled`), read only when one exists; one of another type is passed over below.
  if found > 0 then others = redis.call('EXISTS', unpack(lists, 2)) end
end
local due_now = first_due and first_due <= now
if not (due_now or limiter or queued > 0 or others > 0) then
  -- Nothing to promote, let go or pop: only `wake` to delete, whatever it holds.
  redis.call('DEL', KEYS[4])
  return {now, next_due_in(first_due), 0, {}, {}}
end
refused = refusal(5)
if refused then return refused end
local max_by_type = cjson.decode(ARGV[6])

-- Promote due scheduled jobs in run-at order, behind the jobs already pending. Bounded so that one
-- call stays short under a huge backlog of due retries; the next call promotes more.
if due_now then
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)
  for _, id in ipairs(due) do
    -- An id without a hash (or whose key holds something else) is dropped, not given a stray hash; the
    -- lease reports nothing for it.
    local job_key = job_key_of(prefix, id)
    if redis.call('TYPE', job_key).ok == 'hash' then
      redis.call('HSET', job_key, 'state', 'pending')
      local fields = redis.call('HMGET', job_key, 'priority', 'type')
      redis.call('LPUSH', pending_key(KEYS[1], fields[1]), id)
      tally(fields[2], 1)
    end
  end
  redis.call('ZREM', KEYS[2], unpack(due))
end

if limiter then limiter.let_go_due_rates() end

-- Promoted or let-go jobs may be in the other lists now.
if due_now or limiter then others = redis.call('EXISTS', unpack(lists, 2)) end
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

-- Lease the popped job `id`, or hold it, or move it to the dead set when its start deadline passed. With
-- `hold_only`, a job that would be leased is left as it is: true when something was done with it.
local function lease_job(id, hold_only)
  local job_key = job_key_of(prefix, id)
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
  -- Counted while pending or held: a stray id of a job in another state (fsck reports it) was never counted.
  local state = at.state and job[at.state]
  local counted_as = is_counted(state) and (job[at.type] or '')
  local expires_at = at.expires_at and tonumber(job[at.expires_at])
  -- A deadline counts until the first start: a job that ran once is retried whatever the time.
  if expires_at and expires_at <= now and not tonumber(at.attempt and job[at.attempt]) then
    move_to_dead(prefix, dead, job_key, id, now, 'expired: not started by its deadline (' ..
      (now - expires_at) .. ' ms ago)', tonumber(ARGV[7]), tonumber(ARGV[8]))
    if counted_as then tally(counted_as, -1) end
    expired[#expired + 1] = id
    return true
  end
  local job_type = job[at.type]
  local plan = limiter and job_type and limiter.plan_of(job_type)
  if hold_only and not plan then return false end
  local slots = nil
  if plan then
    local held, taken = limiter.admit(plan, job_key, id, job, at, hold_only)
    if held then return true end
    if hold_only then return false end
    slots = taken
  end
  leased = leased + 1
  if counted_as then tally(counted_as, -1) end
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
  until #ids == 0 or leased >= count or not limiter or limiter.held_all()
end

-- Hold ahead: with the caller's slots all taken, jobs over a full limit at the head of the pending lists
-- would stand in front of the jobs behind them until the next lease. They are held now (a key's backlog
-- reaches its turns, or its limit's list, at up to MAX_HELD jobs a call (includes/lease_limits.lua),
-- whatever the caller's slots), and the first job that would be leased stays where it is.
local function hold_ahead()
  for _, list in ipairs(others == 0 and {KEYS[1]} or lease_order) do
    if redis.call('TYPE', list).ok == 'list' then
      while not limiter.held_all() do
        local id = redis.call('LINDEX', list, -1)
        if not id then break end
        if not lease_job(id, true) then return end
        redis.call('RPOP', list)
      end
      if limiter.held_all() then return end
    end
  end
end
-- Only while limits bind (a group held a job lately): limits that never do cost no read more per call.
if limiter and leased >= count and limiter.binds() then hold_ahead() end

call_in_chunks('ZADD', KEYS[3], deadlines)
count_pending_by_type(prefix, counted)
if limiter then limiter.add_taken() end
if redis.call('LLEN', KEYS[1]) == 0 and (others == 0 or redis.call('EXISTS', unpack(lists, 2)) == 0) then
  redis.call('DEL', KEYS[4])
end
if due_now then first_due = earliest() end  -- the type is known by now: no refusal here
reply[2] = next_due_in(first_due)
return reply
