--- @include "keys"
--- @include "wake"
--- @include "batch_counters"
--- @include "call_in_chunks"
--- @include "wrong_type"
--- @include "pending_key"
--- @include "count_pending"

-- Storing new jobs, shared by enqueue and the scripts that create jobs of their own (a schedule's fire).
-- A record is ARGV values back to back:
--   id, type, payload, run_at_ms ("0": none), delay_ms ("0": none), unique_key ("": none),
--   unique_ttl_ms, n, then n field/value pairs of optional fields (optional_fields below)
-- `parse_records(first)` checks every record from ARGV[first] to the end and returns them, or an error
-- reply; `refuse_wrong_types` and `store_jobs` then write them. A script calls all three before any write
-- of its own: a script that fails half-way keeps the writes it already made.

-- Optional field -> how it is handled: "store" (kept in the job hash as given) or "read" (read here),
-- with "+" when it must be a positive number. Built only for a record that has optional fields: a script's
-- whole body runs on every call, and most records have none.
local function optional_fields()
  return {content_type = 'store', max_attempts = 'store+', timeout = 'store+', backoff = 'store+',
    traceparent = 'store', meta = 'store', batch = 'store', key = 'store', priority = 'store', expires_at = 'store+',
    expires_in = 'read+', unique_mode = 'read', debounce_key = 'read', debounce_ms = 'read+', debounce_max_ms = 'read+',
    after = 'store', on_dependency_failure = 'store', dependents = 'read', parent = 'store',
    keep_for = 'store+'}
end
-- A debounced job's key outlives its run time by this much, so a job promoted late is still found.
local DEBOUNCE_LOCK_MARGIN_MS = 600000

-- The references "<queue>/<id>" of a JSON array (`after`, `dependents`: ADR 0016), or nil when it is not one.
local function job_refs(value)
  local ok, refs = pcall(cjson.decode, value)
  if not ok or type(refs) ~= 'table' or #refs == 0 then return nil end
  for _, ref in ipairs(refs) do
    if type(ref) ~= 'string' or not string.find(ref, '^[%w][%w._-]*/.') then return nil end
  end
  return refs
end

local function malformed(i, what)
  return redis.error_reply('ERR jobcar enqueue: ' .. what .. ' at ARGV[' .. i .. ']')
end

-- Each record as a table: at (its first ARGV index), fields (name, value... to store; only when given), priority,
-- expires_in, window (the unique key is held for its whole TTL), debounce_key, debounce_ms, debounce_max_ms.
local function parse_records(first)
  local records = {}
  local kinds = nil
  local i = first
  while i <= #ARGV do
    local nextra = tonumber(ARGV[i + 7])
    if not nextra or i + 7 + 2 * nextra > #ARGV then return malformed(i, 'malformed record') end
    if not tonumber(ARGV[i + 3]) or not tonumber(ARGV[i + 4]) then
      return malformed(i, 'run_at_ms and delay_ms must be numbers')
    end
    if ARGV[i + 5] ~= '' and not ((tonumber(ARGV[i + 6]) or 0) > 0) then
      return malformed(i, 'a unique key needs a positive unique_ttl_ms')
    end
    local record = {at = i}
    if nextra > 0 then
      kinds = kinds or optional_fields()
      record.fields = {}
    end
    for f = i + 8, i + 7 + 2 * nextra, 2 do
      local name, value = ARGV[f], ARGV[f + 1]
      local kind = kinds[name]
      if not kind then
        return redis.error_reply('ERR jobcar enqueue: unknown job field "' .. name .. '"')
      end
      if kind:sub(-1) == '+' and not ((tonumber(value) or 0) >= 1) then
        return redis.error_reply('ERR jobcar enqueue: ' .. name .. ' must be a positive number')
      end
      if name == 'meta' and not pcall(cjson.decode, value) then
        return redis.error_reply('ERR jobcar enqueue: meta must be a JSON object')
      end
      if name == 'priority' and not (#value == 1 and value:match('%d')) then
        return redis.error_reply('ERR jobcar enqueue: priority must be a whole number from 0 to 9')
      end
      if name == 'unique_mode' and value ~= 'until_done' and value ~= 'window' then
        return redis.error_reply('ERR jobcar enqueue: unique_mode must be until_done or window')
      end
      if name == 'on_dependency_failure' and value ~= 'fail' and value ~= 'run' and value ~= 'cancel' then
        return redis.error_reply('ERR jobcar enqueue: on_dependency_failure must be fail, run or cancel')
      end
      if name == 'after' or name == 'dependents' then
        local refs = job_refs(value)
        if not refs then
          local what = ' must be a JSON array of "<queue>/<id>" references'
          return redis.error_reply('ERR jobcar enqueue: ' .. name .. what)
        end
        record[name] = refs
      end
      if kind:sub(1, 5) == 'store' then
        record.fields[#record.fields + 1] = name
        record.fields[#record.fields + 1] = value
      end
      if name == 'priority' then record.priority = value end
      if name == 'expires_in' then record.expires_in = tonumber(value) end
      if name == 'unique_mode' then record.window = value == 'window' end
      if name == 'debounce_key' then record.debounce_key = value end
      if name == 'debounce_ms' then record.debounce_ms = tonumber(value) end
      if name == 'debounce_max_ms' then record.debounce_max_ms = tonumber(value) end
      if name == 'batch' then record.batch = value end
    end
    if (record.debounce_key ~= nil) ~= (record.debounce_ms ~= nil) then
      return malformed(i, 'debounce_key and debounce_ms go together')
    end
    if record.debounce_max_ms and not record.debounce_key then
      return malformed(i, 'debounce_max_ms needs debounce_key')
    end
    if record.debounce_key and ARGV[i + 5] ~= '' then
      return malformed(i, 'a job is debounced or unique, not both')
    end
    if record.window and ARGV[i + 5] == '' then return malformed(i, 'unique_mode needs a unique key') end
    if record.after and (record.debounce_key or tonumber(ARGV[i + 3]) ~= 0 or tonumber(ARGV[i + 4]) ~= 0) then
      return malformed(i, 'a job waiting for others (after) runs when they are done, not delayed or debounced')
    end
    records[#records + 1] = record
    i = i + 8 + 2 * nextra
  end
  return records
end

-- The key of a record's lock: a unique key held until the job ends, one held for its whole TTL (`window`),
-- or a debounce key. Nil when the record has none.
local function lock_of(prefix, record)
  local unique = ARGV[record.at + 5]
  if record.debounce_key then return debounce_key_of(prefix, record.debounce_key) end
  if unique == '' then return nil end
  if record.window then return window_key_of(prefix, unique) end
  return unique_key_of(prefix, unique)
end

-- The WRONGTYPE refusal if a key the records write holds another type, else nil. A record's own keys
-- need it only in a call of several: the first command on each (HGET, GET) fails before that record
-- writes anything, and a lone record has no earlier one whose writes would stay. Nor does `scheduled` for a
-- lone record runnable now (no run_at, delay or debounce: the usual call), which cannot write it. A batch's
-- counters need none: `bump_batch` skips another type; nor do the priorities' lists: `pending_key` passes
-- over one.
-- In a call of several, each record's job hash is checked by reading its state (HGET through pcall) rather than
-- its type: the read store_jobs needs anyway, done once here. Returns nil and those states then (an array, in
-- the records' order; false for no job), for store_jobs.
local function refuse_wrong_types(prefix, records, pending, scheduled)
  local lone = records[2] == nil and records[1]
  if lone and not lone.debounce_key and tonumber(ARGV[lone.at + 3]) == 0 and tonumber(ARGV[lone.at + 4]) == 0 then
    return wrong_type({pending, 'list'})
  end
  local refused = wrong_type({pending, 'list', scheduled, 'zset'})
  if refused or not records[2] then return refused end
  local states, locks = {}, {}
  for i, record in ipairs(records) do
    local job_key = job_key_of(prefix, ARGV[record.at])
    local state = redis.pcall('HGET', job_key, 'state')
    if type(state) == 'table' then return wrong_type({job_key, 'hash'}) end
    states[i] = state
    local lock = lock_of(prefix, record)
    if lock then
      locks[#locks + 1] = lock
      locks[#locks + 1] = 'string'
    end
  end
  return wrong_type(locks), states
end

-- A debounced record whose key names a job still waiting (scheduled) gives that job its payload and a
-- later run time instead of storing a new job: now + debounce_ms, at most the job's `debounce_until`.
-- Returns the waiting job's id, or nil when there is none (the record is stored as a new job).
local function debounce_into_waiting(prefix, record, now, scheduled, lock)
  local holder = redis.call('GET', lock)
  if not holder then return nil end
  local holder_key = job_key_of(prefix, holder)
  local found = redis.pcall('HMGET', holder_key, 'state', 'debounce', 'debounce_until')
  if found.err or found[1] ~= 'scheduled' or found[2] ~= record.debounce_key then return nil end
  local run_at = now + record.debounce_ms
  local until_ms = tonumber(found[3])
  if until_ms and run_at > until_ms then run_at = until_ms end
  local content_type = nil
  for f = 1, #(record.fields or {}), 2 do
    if record.fields[f] == 'content_type' then content_type = record.fields[f + 1] end
  end
  redis.call('HSET', holder_key, 'payload', ARGV[record.at + 2], 'run_at', run_at)
  if content_type then
    redis.call('HSET', holder_key, 'content_type', content_type)
  else
    redis.call('HDEL', holder_key, 'content_type')
  end
  redis.call('ZADD', scheduled, run_at, holder)
  redis.call('SET', lock, holder, 'PX', run_at - now + DEBOUNCE_LOCK_MARGIN_MS)
  return holder
end

-- Store the parsed records at Redis time `now`; returns one reply entry per record, in order:
--   "pending" | "scheduled" | "waiting"         created, in that state (waiting: for the jobs in `after`,
--                                               <prefix>deps:<id>; `dependents` names the jobs waiting for
--                                               this one, stored before it: ADR 0016)
--   {"exists", id, state}                       a job with this id exists (nothing written)
--   {"duplicate", holder's id, holder's state}  the unique key is held (nothing written)
--   {"debounced", waiting id, "scheduled"}      the debounce key's waiting job took the payload
local function store_jobs(prefix, records, now, pending, scheduled, wake_key, states)
  local replies = {}
  -- With `states` (refuse_wrong_types read them), a record's job is as read there, or as an earlier record of
  -- this call stored it (`stored`: id -> state).
  local stored = states and {}
  local woken = false
  -- ids for each pending list, pushed together at the end (in order, as one LPUSH each would)
  local runnable, lists = {}, {}
  -- The jobs made pending, counted once per type at the end (includes/count_pending.lua): those of the first
  -- such type in two locals, any other type's in a table made only then (a table costs an enqueue about as much
  -- as a command).
  local made_type, made, made_others = nil, 0, nil
  -- jobs stored per batch, counted once each at the end (a Spark partition's jobs share one)
  local totals, batches = {}, {}
  for i, record in ipairs(records) do
    local r = record.at
    local id, job_type, payload = ARGV[r], ARGV[r + 1], ARGV[r + 2]
    local run_at, delay = tonumber(ARGV[r + 3]), tonumber(ARGV[r + 4])
    local unique, unique_ttl = ARGV[r + 5], ARGV[r + 6]

    local job_key = job_key_of(prefix, id)
    local existing = nil
    if states then
      existing = stored[id] or states[i]
    else
      existing = redis.call('HGET', job_key, 'state')
    end
    local lock = lock_of(prefix, record)
    local holder, debounced = nil, nil
    if not existing and record.debounce_key then
      debounced = debounce_into_waiting(prefix, record, now, scheduled, lock)
    elseif not existing and lock then
      if not redis.call('SET', lock, id, 'NX', 'PX', unique_ttl) then holder = redis.call('GET', lock) end
    end

    if existing then
      -- Jobs stored before it to wait for it still do, unless it ended (the producer then tells them).
      if record.dependents and existing ~= 'done' and existing ~= 'dead' and existing ~= 'canceled' then
        call_in_chunks('SADD', dependents_key_of(prefix, id), record.dependents)
        redis.call('HSET', job_key, 'dependents', '1')
      end
      replies[#replies + 1] = {'exists', id, existing}
    elseif holder then
      -- A window outlives its holder: a holder gone has finished. Until it is done, a lock names a live job.
      local gone = record.window and 'done' or 'pending'
      replies[#replies + 1] = {'duplicate', holder, redis.call('HGET', job_key_of(prefix, holder), 'state') or gone}
    elseif debounced then
      replies[#replies + 1] = {'debounced', debounced, 'scheduled'}
    else
      if record.debounce_key then run_at, delay = 0, record.debounce_ms end
      if run_at == 0 and delay > 0 then run_at = now + delay end
      local state = 'pending'
      if record.after then
        state = 'waiting'
      elseif run_at > now then
        state = 'scheduled'
      end
      redis.call('HSET', job_key, 'type', job_type, 'payload', payload, 'state', state, 'created', now)
      if stored then stored[id] = state end
      if record.fields and #record.fields > 0 then redis.call('HSET', job_key, unpack(record.fields)) end
      if record.expires_in then redis.call('HSET', job_key, 'expires_at', now + record.expires_in) end
      if record.debounce_key then
        redis.call('HSET', job_key, 'debounce', record.debounce_key)
        if record.debounce_max_ms then redis.call('HSET', job_key, 'debounce_until', now + record.debounce_max_ms) end
        redis.call('SET', lock, id, 'PX', run_at - now + DEBOUNCE_LOCK_MARGIN_MS)
      elseif record.window then
        redis.call('HSET', job_key, 'unique_window', unique)
      elseif unique ~= '' then
        redis.call('HSET', job_key, 'unique', unique)
      end
      if record.dependents then
        call_in_chunks('SADD', dependents_key_of(prefix, id), record.dependents)
        redis.call('HSET', job_key, 'dependents', '1')
      end
      if state == 'waiting' then
        call_in_chunks('SADD', deps_key_of(prefix, id), record.after)
        redis.call('ZADD', waiting_key_of(prefix), now, id)
      elseif state == 'scheduled' then
        redis.call('HSET', job_key, 'run_at', run_at)
        redis.call('ZADD', scheduled, run_at, id)
        -- A job due before everything else must shorten the sleep of idle daemons.
        if not woken and redis.call('ZRANGE', scheduled, 0, 0)[1] == id then
          wake(wake_key)
          woken = true
        end
      else
        local list = pending_key(pending, record.priority)
        if not runnable[list] then
          runnable[list] = {}
          lists[#lists + 1] = list
        end
        local ids = runnable[list]
        ids[#ids + 1] = id
        if made == 0 or job_type == made_type then
          made_type, made = job_type, made + 1
        else
          made_others = made_others or {}
          made_others[job_type] = (made_others[job_type] or 0) + 1
        end
      end
      if record.batch then
        if not totals[record.batch] then batches[#batches + 1] = record.batch end
        totals[record.batch] = (totals[record.batch] or 0) + 1
      end
      replies[#replies + 1] = state
    end
  end
  for _, list in ipairs(lists) do call_in_chunks('LPUSH', list, runnable[list]) end
  if made > 0 then count_pending(prefix, made_type, made) end
  if made_others then count_pending_by_type(prefix, made_others) end
  for _, batch in ipairs(batches) do bump_batch(batch_key_of(prefix, batch), 'total', totals[batch]) end
  if #lists > 0 and not woken then wake(wake_key) end
  return replies
end
