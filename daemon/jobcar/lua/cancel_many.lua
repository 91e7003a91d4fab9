#!lua flags=allow-oom
-- cancel_many: the step of a bulk cancel by filter (`jobcar jobs cancel`, POST /v1/jobs/cancel, the dashboard):
-- deletes each of these jobs that is still in the state the operator's pass found it in, as cancel.lua deletes
-- one. A job that left that state meanwhile (a daemon leased it, a limit held or let it go, it was promoted,
-- released or ended) is left as it is: a bulk cancel never stops a running job.
--
-- KEYS[1] pending    LIST  (names the queue's slot; a job of priority p > 0 waits in `pending:<p>`)
-- KEYS[2] scheduled  ZSET
-- ARGV[1] the queue's key prefix
-- ARGV[2] the state the pass found them in: pending | scheduled | held | waiting
-- ARGV[3..] id, index pairs (a few hundred a call: the caller's step): the index, from the left end, at which
--           the pass read a pending or held job in its list (-1: none), a hint the script checks (LINDEX)
-- Touches what cancel.lua touches for each: <prefix>job:<id> (deleted, with its handler data), its pending list,
-- <prefix>pending:released, <prefix>held:<group> and <prefix>limit_groups, <prefix>waiting and
-- <prefix>deps:<id>, <prefix>unique:<key> (released), <prefix>batch:<batch> (canceled += n), <prefix>settled
-- (the jobs waiting for them are told).
-- A pending or held job still at its index is marked there (LSET), and each list touched loses its marks in one
-- LREM at the end: a step costs one walk of a list up to its furthest job, not one per job. A job no longer at
-- its index is looked for from the left end of its list (LREM).
-- Returns {canceled, left}: jobs deleted; jobs no longer in that state (or gone), left as they are.
-- While <prefix>settled holds another type, refused before any write (as cancel.lua refuses a job others
-- wait for): the reply names the key.

--- @include "keys"
--- @include "release_unique"
--- @include "pending_key"
--- @include "count_in_batch"
--- @include "unpark"
--- @include "tell_dependents"
--- @include "handler_data"
--- @include "count_pending"

local prefix, wanted = ARGV[1], ARGV[2]
if wanted ~= 'pending' and wanted ~= 'scheduled' and wanted ~= 'held' and wanted ~= 'waiting' then
  return redis.error_reply('ERR jobcar cancel_many: not a state to cancel: ' .. tostring(wanted))
end
local refused = untold_refusal(prefix, '1')
if refused then return refused end
local told = dependents_told(prefix)
-- Never a job id (ids are printable text): the mark of a canceled job's place until the last LREM.
local MARK = '\0jobcar:canceled'
local marks, marked_lists, groups, group_list = {}, {}, {}, {}
local function mark(list, index, id)
  if index < 0 or redis.pcall('LINDEX', list, index) ~= id then return false end
  redis.call('LSET', list, index, MARK)
  if not marks[list] then
    marks[list] = 0
    marked_lists[#marked_lists + 1] = list
  end
  marks[list] = marks[list] + 1
  return true
end
local canceled, left = 0, 0
local uncounted = {}  -- type -> pending or held jobs canceled (includes/count_pending.lua)
for i = 3, #ARGV - 1, 2 do
  local id, index = ARGV[i], tonumber(ARGV[i + 1]) or -1
  local job_key = job_key_of(prefix, id)
  local f = redis.pcall('HMGET', job_key, 'state', 'priority', 'held', 'type')
  if f.err or f[1] ~= wanted then
    left = left + 1
  else
    if wanted == 'pending' then
      local list, released = pending_key(KEYS[1], f[2]), released_key_of(prefix)
      if not mark(list, index, id) and not mark(released, index, id) then
        if redis.call('LREM', list, 1, id) == 0 then
          redis.pcall('LREM', released, 1, id)  -- let go by a limit (ADR 0014)
        end
      end
    elseif wanted == 'scheduled' then
      redis.call('ZREM', KEYS[2], id)
    elseif wanted == 'waiting' then
      redis.call('ZREM', waiting_key_of(prefix), id)
      redis.call('DEL', deps_key_of(prefix, id))
    elseif f[3] then
      local list = held_key_of(prefix, f[3])
      if not mark(list, index, id) then redis.pcall('LREM', list, 1, id) end
      if not groups[f[3]] then
        groups[f[3]] = true
        group_list[#group_list + 1] = f[3]
      end
    end
    if wanted == 'pending' or wanted == 'held' then
      local job_type = f[4] or ''
      uncounted[job_type] = (uncounted[job_type] or 0) - 1
    end
    release_unique(prefix, job_key, id)
    count_in_batch(prefix, job_key, 'canceled', 1)
    told.add(job_key, id, 'canceled')
    redis.call('DEL', job_key)
    drop_handler_data(prefix, id)
    canceled = canceled + 1
  end
end
for _, list in ipairs(marked_lists) do
  redis.call('LREM', list, marks[list], MARK)
end
for _, group in ipairs(group_list) do
  forget_idle_group(prefix, group)
end
count_pending_by_type(prefix, uncounted)
told.push()
return {canceled, left}
