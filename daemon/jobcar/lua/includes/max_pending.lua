--- @include "keys"
--- @include "settings_fields"

-- Backpressure (ADR 0024): a queue's `max_pending` and its types' `max_pending:<type>`, which the daemons serving
-- it write into <prefix>settings, bound the jobs pending or held in the queue (its pending lists and its limits'
-- held lists; not the scheduled, waiting or active ones), all of them and those of each type: the counts of
-- <prefix>pending_counts (includes/count_pending.lua). `refuse_over_max_pending` refuses a call whose new jobs
-- would take a count past its bound, whole, before anything is written:
--   FULL jobcar enqueue: <pending> pending, max_pending <max>, <new> new refused
--   FULL jobcar enqueue: <pending> pending of type <type>, max_pending <max>, <new> new refused
-- Every record counts as one new job whatever state it would be created in, except a record whose id names a
-- job already stored (it writes nothing), looked for only when the quick count says no. No bound costs one
-- HMGET (the queue's field and one per type of the call); a bound, one read of the counts more: O(1) for a
-- type, O(types) for the queue, however many jobs wait.
-- A refusal adds its new jobs to the hash's `refused` field, the only write it makes.
-- `read`, when given, is the HMGET of a lone record's bounds that the caller already made (includes/store_plain.lua).
-- Returns that error reply, or nil.
local function refuse_over_max_pending(prefix, records, read)
  if #records == 0 then return nil end
  local settings = settings_key_of(prefix)
  -- The bounds that apply, read in one HMGET: the queue's, then each of the call's types'. The usual call has one
  -- type, and then builds no table: in an enqueue, a table costs about as much as a command.
  local first = ARGV[records[1].at + 1]
  local mixed = false
  for i = 2, #records do
    if ARGV[records[i].at + 1] ~= first then
      mixed = true
      break
    end
  end
  local order, bounds = nil, nil  -- order: the types in the order of their bounds, when there are several
  if not mixed then
    bounds = read or redis.call('HMGET', settings, MAX_PENDING_FIELD, TYPE_BOUND_PREFIX .. first)
  else
    local fields, named = {MAX_PENDING_FIELD}, {}
    order = {}
    for _, record in ipairs(records) do
      local job_type = ARGV[record.at + 1]
      if not named[job_type] then
        named[job_type] = true
        order[#order + 1] = job_type
        fields[#fields + 1] = TYPE_BOUND_PREFIX .. job_type
      end
    end
    bounds = redis.call('HMGET', settings, unpack(fields))
  end
  -- Each bound as a number, or false (no field, or one that is not a positive number: fsck reports it). What
  -- follows is done only for a bounded queue or type: a call without a bound pays for none of it.
  local bounded = false
  for i = 1, #bounds do
    local max = tonumber(bounds[i])
    bounds[i] = max and max >= 1 and max
    bounded = bounded or bounds[i]
  end
  if not bounded then return nil end
  -- A counts key of another type, or a field that is no count (fsck reports both), counts as none.
  local counts_key = pending_counts_key_of(prefix)
  if not mixed then
    -- The quick count of a call of one type, as if every record were new: the queue's count and the type's from
    -- one read. Only a call that would pass a bound so is looked at closer, below.
    local queue_n, type_n = 0, 0
    if bounds[1] then
      -- HGETALL, not HVALS: the commands a confined ACL user is given stay those of the last version.
      local counts = redis.pcall('HGETALL', counts_key)
      if not counts.err then
        for i = 1, #counts, 2 do
          local n = tonumber(counts[i + 1]) or 0
          queue_n = queue_n + n
          if counts[i] == first then type_n = n end
        end
      end
    else
      type_n = tonumber(redis.pcall('HGET', counts_key, first)) or 0
    end
    local all = #records
    if (not bounds[1] or queue_n + all <= bounds[1]) and (not bounds[2] or type_n + all <= bounds[2]) then
      return nil
    end
  end
  order = order or {first}
  local calls = {}  -- type -> its records in this call
  for _, record in ipairs(records) do
    local job_type = ARGV[record.at + 1]
    calls[job_type] = (calls[job_type] or 0) + 1
  end
  local function count_of(job_type)
    return tonumber(redis.pcall('HGET', counts_key, job_type)) or 0
  end
  -- The records whose id names no stored job, of one type or all: read once, and only when a bound would be
  -- passed if every record were new.
  local new_ones = nil
  local function new_of(job_type)
    if not new_ones then
      new_ones = {}
      for _, record in ipairs(records) do
        if redis.call('EXISTS', job_key_of(prefix, ARGV[record.at])) == 0 then
          local t = ARGV[record.at + 1]
          new_ones[t] = (new_ones[t] or 0) + 1
        end
      end
    end
    if job_type then return new_ones[job_type] or 0 end
    local n = 0
    for _, each in pairs(new_ones) do n = n + each end
    return n
  end
  local function refuse(n, of_type, max, new)
    -- Counted where every producer's refusals meet: `jobcar stats` and the metrics show it.
    redis.call('HINCRBY', settings, REFUSED_FIELD, new)
    return redis.error_reply('FULL jobcar enqueue: ' .. n .. ' pending' .. of_type .. ', max_pending ' .. max .. ', '
      .. new .. ' new refused')
  end
  local queue_max = bounds[1]
  if queue_max then
    local n = 0
    local counts = redis.pcall('HGETALL', counts_key)
    if not counts.err then
      for i = 2, #counts, 2 do n = n + (tonumber(counts[i]) or 0) end
    end
    if n + #records > queue_max then
      local new = new_of(nil)
      if new > 0 and n + new > queue_max then return refuse(n, '', queue_max, new) end
    end
  end
  for i, job_type in ipairs(order) do
    local max = bounds[i + 1]
    if max then
      local n = count_of(job_type)
      if n + calls[job_type] > max then
        local new = new_of(job_type)
        if new > 0 and n + new > max then return refuse(n, ' of type ' .. job_type, max, new) end
      end
    end
  end
  return nil
end
