#!lua flags=allow-oom
-- pause: stop (or resume) leasing from a queue. Enqueues and running jobs are not affected.
--
-- KEYS[1] paused  STRING  present while paused
-- KEYS[2] wake    LIST
-- ARGV[1] the queue's key prefix (unused; every script takes it)
-- ARGV[2] "1" pauses, "0" resumes
-- Returns 1 when the state changed, 0 when the queue already was in it.
-- Allowed under OOM (one small key per queue): an operator must be able to resume a queue on a full server.

--- @include "wake"

if ARGV[2] == '1' then
  if redis.call('SET', KEYS[1], '1', 'NX') then return 1 end
  return 0
end
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
wake(KEYS[2])
return 1
