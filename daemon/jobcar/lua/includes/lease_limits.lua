--- @include "keys"
--- @include "group_names"
--- @include "limit_groups"
--- @include "gcra"
--- @include "turns"
--- @include "call_in_chunks"

-- The fleet-wide limits (ADR 0014) as one lease call applies them, from `limits` (type -> rule, decoded):
-- which limit group a job is held in, the slots and rate starts the leased jobs take, and the rate groups
-- whose next start is due. Made only when the call has limits: a lease without them creates none of these
-- functions. `started` is the call's start time as stored; `cannot_hold(job_key, id, why)` takes a job whose
-- group's held list holds another type than a list. The call's state lives here: the slots it read and
-- took, the groups it indexed, how many jobs it held (at most MAX_HELD: one call's work stays bounded).
local function lease_limits(prefix, limits, now, started, cannot_hold)
  local MAX_HELD = 1000
  local throttled = throttled_key_of(prefix)
  local held = 0
  local running = {}  -- type -> its slots taken, read once per call
  local by_key = {}  -- type -> key -> its slots taken, read once per call and only when a key could be full
  local taken = {}  -- type -> {id, key, id, key...}: the slots this call took, one HSET per type at the end
  local indexed = {}  -- limit groups added to <prefix>limit_groups by this call
  local plans = {}  -- type -> its rule as applied to its jobs (includes/limit_groups.lua), or false

  -- The earlier of `due` (ms, or nil) and the earliest time a rate-limited group may start its next held job.
  local function next_start(due)
    local rated = redis.pcall('ZRANGE', throttled, 0, 0, 'WITHSCORES')
    if not rated.err and rated[2] and (not due or tonumber(rated[2]) < due) then due = tonumber(rated[2]) end
    return due
  end

  -- Rate-limited groups whose next start is due let their held jobs go, as many as may start now; a group
  -- the rules no longer limit lets them all go. Before the pending lists are read: they are leased next.
  local function let_go_due_rates()
    local groups = redis.pcall('ZRANGEBYSCORE', throttled, '-inf', now, 'LIMIT', 0, 100)
    if groups.err or #groups == 0 then return end
    redis.call('ZREM', throttled, unpack(groups))
    for _, group in ipairs(groups) do
      local interval, burst = rate_of(limits, group)
      local n = MAX_HELD
      if interval and interval > 0 then
        local _, tat = gcra_wait(prefix, group, interval, burst, now)
        n = math.max(1, math.floor((now + interval * (burst - 1) - tat) / interval) + 1)
        -- Due again after those n starts, whoever takes them: a job let go that another limit holds back
        -- takes no start, and the jobs still held must not wait for the reaper's pass.
        if unpark(prefix, group, n) == n and redis.call('EXISTS', held_key_of(prefix, group)) == 1 then
          redis.call('ZADD', throttled, 'LT', tat + n * interval - interval * (burst - 1), group)
        end
      else
        unpark(prefix, group, n)
      end
    end
  end

  -- Only a group that held a job is indexed: the slots of a type whose groups never filled need no sweep (a
  -- slot leaked there binds nothing until a group is full, and then its held jobs index it).
  local function index_group(name)
    if not indexed[name] then
      redis.call('SADD', limit_groups_key_of(prefix), name)
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
      if again and redis.call('EXISTS', held_key_of(prefix, rate[1])) == 1 then
        throttle(rate[1], next_tat - rate[2] * (rate[3] - 1))
      end
    end
  end

  -- The slots of `job_type` taken: its slot hash's length, read once per call; false when the slot hash holds
  -- another type (fsck reports it), whose slots cannot be counted.
  local function type_taken(job_type)
    local n = running[job_type]
    if n == nil then
      n = redis.pcall('HLEN', slots_key_of(prefix, job_type))
      if type(n) ~= 'number' then n = false end
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

  -- A job held before (and let go by a slot given back) is older than the group's other held jobs: it goes
  -- back to the head of the list, a new one to its tail. A held list of another type (fsck reports it)
  -- cannot take the job: `cannot_hold` takes it. It counts as held, so that one call's work stays bounded.
  local function hold(job_key, id, group, again)
    local list = held_key_of(prefix, group)
    if type(redis.pcall(again and 'RPUSH' or 'LPUSH', list, id)) ~= 'number' then
      cannot_hold(job_key, id, 'its limit group ' .. group .. ' cannot hold it: ' .. list .. ' holds a ' ..
        redis.call('TYPE', list).ok .. ', not a list (jobcar fsck finds it and repairs it)')
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
    hold(job_key, id, turn_group(job_type, key), again)
    index_group(job_type)
    join_turns(prefix, job_type, key)
  end

  -- A job let go for its key's turn that another limit (its key's, a rate) holds back takes no slot of the
  -- total: the turn passes to the next key, or that slot would wait for the next one given back.
  local function pass_turn(rule, job_type, held_in)
    if rule.fair and held_in and is_turn_group(held_in) then next_turns(prefix, job_type, 1) end
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

  -- The rule of `job_type` as applied to its jobs, worked out at its first job; false for a type without one.
  local function plan_of(job_type)
    local plan = plans[job_type]
    if plan == nil then
      local rule = limits[job_type]
      plan = rule and limit_plan(rule) or false
      if plan then plan.job_type = job_type end
      plans[job_type] = plan
    end
    return plan
  end

  -- Hold job `id` (an HGETALL reply `job`, `at` its field indexes) if a group of its type's `plan` is full
  -- or rate-limited: true. Otherwise false, with the names of the groups whose slots it took, one per line
  -- (nil for none). With `hold_only`, a job that would be leased takes nothing.
  local function admit(plan, job_key, id, job, at, hold_only)
    local rule, job_type = plan.rule, plan.job_type
    local key = plan.key_field and read_key(plan.key_field, plan.key_name, job, at)
    -- A job takes one slot of its type, which counts in its type's total and in its key's group.
    local per_key = key and rule.per_key and key_group(job_type, key)
    -- A type whose slots cannot be counted would run over its limits unseen: its job cannot be held or
    -- leased, so it goes to the dead set with the reason, as where its held list cannot hold it. The count
    -- is read here only where the limits below read it anyway.
    if (rule.total or per_key) and not type_taken(job_type) then
      local slots = slots_key_of(prefix, job_type)
      cannot_hold(job_key, id, 'the slots of its type ' .. job_type .. ' cannot be counted: ' .. slots ..
        ' holds a ' .. redis.call('TYPE', slots).ok .. ', not a hash (jobcar fsck finds it and repairs it)')
      held = held + 1
      return true
    end
    if rule.total and type_taken(job_type) >= rule.total then
      if rule.fair then
        hold_for_turn(job_key, id, job_type, key or '', at.held)
      else
        hold(job_key, id, job_type, at.held)
      end
      return true
    elseif per_key and key_full(job_type, key, rule.per_key) then
      pass_turn(rule, job_type, at.held and job[at.held])
      hold(job_key, id, per_key, at.held)
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
    if per_key then
      take_slot(job_type, id, key)
      return false, rule.total and job_type .. '\n' .. per_key or per_key
    elseif rule.total then
      take_slot(job_type, id, '')
      return false, job_type
    end
    return false
  end

  -- Whether the call held as many jobs as it may.
  local function held_all()
    return held >= MAX_HELD
  end

  -- Whether the limits bind (a group held a job lately) and the call may hold more: limits that never bind
  -- cost no read more per call.
  local function binds()
    return held < MAX_HELD and (held > 0 or redis.call('EXISTS', limit_groups_key_of(prefix)) == 1)
  end

  -- The call's slots join the slot hashes: one HSET per type.
  local function add_taken()
    for job_type, pairs_taken in pairs(taken) do
      call_in_chunks('HSET', slots_key_of(prefix, job_type), pairs_taken, true)
    end
  end

  -- One table made whole: a lease with limits builds it once per call.
  return {next_start = next_start, let_go_due_rates = let_go_due_rates, plan_of = plan_of, admit = admit,
    held_all = held_all, binds = binds, add_taken = add_taken}
end
