--- @include "wake"
--- @include "add_to_batch"
--- @include "call_in_chunks"
--- @include "wrong_type"

-- Storing new jobs, shared by enqueue and the scripts that create jobs of their own (a schedule's fire).
-- A record is ARGV values back to back:
--   id, type, payload, run_at_ms ("0": none), delay_ms ("0": none), unique_key ("": none),
--   unique_ttl_ms, n, then n field/value pairs of optional fields
-- `parse_records(first)` checks every record from ARGV[first] to the end and returns their indexes, or an
-- error reply; `refuse_wrong_types` and `store_jobs` then write them. A script calls all three before
-- any write of its own: a script that fails half-way keeps the writes it already made.

local OPTIONAL = {content_type = true, max_attempts = true, timeout = true, traceparent = true, meta = true,
  batch = true}

local function parse_records(first)
  local records = {}
  local i = first
  while i <= #ARGV do
    local nextra = tonumber(ARGV[i + 7])
    if not nextra or i + 7 + 2 * nextra > #ARGV then
      return redis.error_reply('ERR jobcar enqueue: malformed record at ARGV[' .. i .. ']')
    end
    if not tonumber(ARGV[i + 3]) or not tonumber(ARGV[i + 4]) then
      return redis.error_reply('ERR jobcar enqueue: run_at_ms and delay_ms must be numbers at ARGV[' .. i .. ']')
    end
    if ARGV[i + 5] ~= '' and not ((tonumber(ARGV[i + 6]) or 0) > 0) then
      return redis.error_reply('ERR jobcar enqueue: a unique key needs a positive unique_ttl_ms at ARGV[' .. i .. ']')
    end
    for f = i + 8, i + 7 + 2 * nextra, 2 do
      local name, value = ARGV[f], ARGV[f + 1]
      if not OPTIONAL[name] then
        return redis.error_reply('ERR jobcar enqueue: unknown job field "' .. name .. '"')
      end
      if (name == 'max_attempts' or name == 'timeout') and not ((tonumber(value) or 0) >= 1) then
        return redis.error_reply('ERR jobcar enqueue: ' .. name .. ' must be a positive number')
      end
      if name == 'meta' and not pcall(cjson.decode, value) then
        return redis.error_reply('ERR jobcar enqueue: meta must be a JSON object')
      end
    end
    records[#records + 1] = i
    i = i + 8 + 2 * nextra
  end
  return records
end

-- The WRONGTYPE refusal if a key the records write holds another type, else nil. A record's own keys
-- need it only in a call of several: the first command on each (HGET, GET) fails before that record
-- writes anything, and a lone record has no earlier one whose writes would stay. A batch's counters need
-- none: `add_to_batch` skips another type.
local function refuse_wrong_types(prefix, records, pending, scheduled)
  local expected = {pending, 'list', scheduled, 'zset'}
  if #records > 1 then
    for _, r in ipairs(records) do
      expected[#expected + 1] = prefix .. 'job:' .. ARGV[r]
      expected[#expected + 1] = 'hash'
      if ARGV[r + 5] ~= '' then
        expected[#expected + 1] = prefix .. 'unique:' .. ARGV[r + 5]
        expected[#expected + 1] = 'string'
      end
    end
  end
  return wrong_type(expected)
end

-- Store the parsed records at Redis time `now`; returns one reply entry per record, in order:
--   "pending" | "scheduled"                     created, in that state
--   {"exists", id, state}                       a job with this id exists (nothing written)
--   {"duplicate", holder's id, holder's state}  the unique key is held (nothing written)
local function store_jobs(prefix, records, now, pending, scheduled, wake_key)
  local replies = {}
  local woken = false
  local runnable = {}  -- ids for pending, pushed together at the end (in order, as one LPUSH each would)
  for _, r in ipairs(records) do
    local id, job_type, payload = ARGV[r], ARGV[r + 1], ARGV[r + 2]
    local run_at, delay = tonumber(ARGV[r + 3]), tonumber(ARGV[r + 4])
    local unique, unique_ttl = ARGV[r + 5], ARGV[r + 6]
    local nextra = tonumber(ARGV[r + 7])

    local job_key = prefix .. 'job:' .. id
    local existing = redis.call('HGET', job_key, 'state')
    local holder = nil
    if not existing and unique ~= '' then
      local lock = prefix .. 'unique:' .. unique
      if not redis.call('SET', lock, id, 'NX', 'PX', unique_ttl) then
        holder = redis.call('GET', lock)
      end
    end

    if existing then
      replies[#replies + 1] = {'exists', id, existing}
    elseif holder then
      replies[#replies + 1] = {'duplicate', holder, redis.call('HGET', prefix .. 'job:' .. holder, 'state') or 'pending'}
    else
      if run_at == 0 and delay > 0 then run_at = now + delay end
      local state = 'pending'
      if run_at > now then state = 'scheduled' end
      redis.call('HSET', job_key, 'type', job_type, 'payload', payload, 'state', state, 'created', now)
      if nextra > 0 then redis.call('HSET', job_key, unpack(ARGV, r + 8, r + 7 + 2 * nextra)) end
      if unique ~= '' then redis.call('HSET', job_key, 'unique', unique) end
      if state == 'scheduled' then
        redis.call('HSET', job_key, 'run_at', run_at)
        redis.call('ZADD', scheduled, run_at, id)
        -- A job due before everything else must shorten the sleep of idle daemons.
        if not woken and redis.call('ZRANGE', scheduled, 0, 0)[1] == id then
          wake(wake_key)
          woken = true
        end
      else
        runnable[#runnable + 1] = id
      end
      for f = r + 8, r + 7 + 2 * nextra, 2 do  -- the batch, if any, is among the optional fields just written
        if ARGV[f] == 'batch' then add_to_batch(prefix, ARGV[f + 1], 'total', 1) end
      end
      replies[#replies + 1] = state
    end
  end
  if #runnable > 0 then
    call_in_chunks('LPUSH', pending, runnable)
    if not woken then wake(wake_key) end
  end
  return replies
end
