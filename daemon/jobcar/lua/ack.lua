#!lua flags=allow-oom
-- ack: finish leased jobs of one queue successfully, or as canceled when an operator asked for that.
-- One call carries one job or many (the daemon acks the jobs that finished during a round trip together).
--
-- KEYS[1]   active  ZSET
-- KEYS[1+n] job     HASH  <prefix>job:<id> of the n-th job
-- ARGV[1]   the queue's key prefix
-- then five per job, the n-th job's at ARGV[5n-3 .. 5n+1]:
--   id, lease token, final state ("done" or "canceled"),
--   retention in ms (0 deletes the job, unless someone waits for it: while <prefix>waiter:<id> lives, the job
--   then stays for that key's PTTL; otherwise the job hash (state, finished, result) stays readable
--   that long; a job's own `keep_for` field, the producer's window, keeps it at least that long, without
--   its payload, meta, traceparent and errors when only the window keeps it), result bytes to keep with the job (already bounded by the caller; "" for none). While
--   the server is out of memory the result is not kept: the job is done, and its `result_dropped` field
--   says why (this script runs under OOM so that jobs still finish; a result would grow a full server).
-- Touches the job's handler data (includes/handler_data.lua: expires with it, or deleted), <prefix>unique:<key>
-- (released), <prefix>batch:<batch> (done or canceled += 1), the job's limit
-- slots (given back: includes/release_slots.lua),
-- <prefix>settled (the jobs waiting for it are told: includes/tell_dependents.lua).
-- Returns one integer per job, in order: 1 finished, 2 finished and jobs in other queues waited for it or for
-- its batch, which this call ended (the caller settles them now rather than at its next pass), 0 lease lost
-- (nothing changed for that job). Jobs of this queue waiting for it are released in this script.

--- @include "now_ms"
--- @include "holds_lease"
--- @include "release_lock"
--- @include "add_to_batch"
--- @include "call_in_chunks"
--- @include "out_of_memory"
--- @include "wrong_type"
--- @include "release_slots"
--- @include "tell_dependents"
--- @include "keys"
--- @include "handler_data"

-- The fields a job kept only by its window (keep_for) drops: what it ran on, not what it became.
local SLIMMED = {payload = true, meta = true, traceparent = true, errors = true, token = true, cancel = true,
  slots = true}
-- Rewritten rather than HDEL'd: a hash that once held a long value (a payload over hash-max-listpack-value)
-- stays a hash table; written anew with short values it is a listpack again (about 3x smaller).
local function keep_slim(job_key)
  local all, kept = redis.call('HGETALL', job_key), {}
  for i = 1, #all, 2 do
    if not SLIMMED[all[i]] then
      kept[#kept + 1] = all[i]
      kept[#kept + 1] = all[i + 1]
    end
  end
  redis.call('DEL', job_key)
  if #kept > 0 then redis.call('HSET', job_key, unpack(kept)) end
end

local refused = wrong_type({KEYS[1], 'zset'})
if refused then return refused end

local prefix = ARGV[1]
-- Every lease read before the first write: a job others wait for tells them through <prefix>settled, and a
-- settled list of another type refuses the whole call here, before it writes, rather than end the job
-- without telling them. Checked only when a job of the call has dependents: other acks pay nothing for it.
-- A job named twice in one call ends once: its second copy is a lost lease, as it was when leases were read
-- one job at a time.
local leases, checked, seen = {}, false, {}
for n = 1, #KEYS - 1 do
  local held, fields = holds_lease(KEYS[1 + n], ARGV[5 * n - 2], 'unique', 'batch', 'slots', 'dependents',
    'handler_data', 'keep_for')
  held = held and not seen[KEYS[1 + n]]
  seen[KEYS[1 + n]] = true
  leases[n] = held and fields
  if held and fields[6] and not checked then
    refused = wrong_type({settled_key_of(prefix), 'list'})
    if refused then return refused end
    checked = true
  end
end

-- Whether anyone waits for a job of this call that is to be deleted (retention 0): one EXISTS over their waiter
-- keys, UNPACK_CHUNK at a time, so that the usual ack, waited for by nobody, pays one command a call rather than a
-- PTTL a job.
local waited = false
do
  local waiters = {}
  for n = 1, #KEYS - 1 do
    if leases[n] and tonumber(ARGV[5 * n]) <= 0 then waiters[#waiters + 1] = waiter_key_of(prefix, ARGV[5 * n - 3]) end
  end
  for first = 1, #waiters, UNPACK_CHUNK do
    waited = waited or redis.call('EXISTS', unpack(waiters, first, math.min(first + UNPACK_CHUNK - 1, #waiters))) > 0
  end
end

local finished, ended = {}, {}
local returns = slot_returns(prefix)
local told = dependents_told(prefix)
-- A call's jobs of one batch are counted in it once (a Spark batch's jobs are acked fifty at a time).
local ended_in, batches = {}, {}  -- batch -> {done = n, canceled = n, last = its last job's n}; in order
for n = 1, #KEYS - 1 do
  local job_key, at = KEYS[1 + n], 5 * n - 3
  local id, final, retention = ARGV[at], ARGV[at + 2], tonumber(ARGV[at + 3])
  local fields = leases[n]
  if fields then
    ended[#ended + 1] = id
    if fields[3] then release_lock(prefix, fields[3], id) end
    if fields[4] then
      local counts = ended_in[fields[4]]
      if not counts then
        counts = {}
        ended_in[fields[4]] = counts
        batches[#batches + 1] = fields[4]
      end
      counts[final] = (counts[final] or 0) + 1
      counts.last = n
    end
    returns.add(id, fields[5])
    local left = told.add(job_key, id, final, fields[6])
    if retention <= 0 and waited then
      -- Kept for whoever waits for it, as long as they said they would wait (no key: -2, deleted as before).
      retention = redis.call('PTTL', waiter_key_of(prefix, id))
    end
    -- The producer's window (keep_for): the longer of it and the retention above. A job kept only by it
    -- (it would have been deleted) keeps its id, state, times and result, not its payload, meta, trace
    -- context or errors: an enqueue of its id finds the hash and answers exists.
    local keep, slim = tonumber(fields[8]) or 0, false
    if keep > retention then
      slim = retention <= 0
      retention = keep
    end
    if retention > 0 then
      if slim then keep_slim(job_key) end
      redis.call('HSET', job_key, 'state', final, 'finished', now_ms())
      redis.call('HDEL', job_key, 'token', 'cancel', 'slots')
      if ARGV[at + 4] ~= '' then
        if out_of_memory() then
          redis.call('HSET', job_key, 'result_dropped', 'redis was out of memory')
        else
          redis.call('HSET', job_key, 'result', ARGV[at + 4])
        end
      end
      redis.call('PEXPIRE', job_key, retention)
      if fields[7] and slim then
        drop_handler_data(prefix, id)
      elseif fields[7] then
        expire_handler_data(prefix, id, retention)
      end
    else
      redis.call('DEL', job_key)
      if fields[7] then drop_handler_data(prefix, id) end
    end
    finished[n] = left and 2 or 1
  else
    finished[n] = 0
  end
end
call_in_chunks('ZREM', KEYS[1], ended)
returns.give_back()
told.push()
for _, batch in ipairs(batches) do
  local counts = ended_in[batch]
  for _, final in ipairs({'done', 'canceled'}) do
    -- A batch this call ended told its callbacks: its last job's reply says so, as for a job's dependents.
    if counts[final] and add_to_batch(prefix, batch, final, counts[final]) then finished[counts.last] = 2 end
  end
end
return finished
