#!lua flags=allow-oom
-- kill: move a leased job straight to the dead-letter set (a permanent failure, or no handler).
--
-- KEYS[1] active  ZSET
-- KEYS[2] dead    ZSET  id -> died-at ms
-- KEYS[3] job     HASH  <prefix>job:<id>
-- ARGV[1] the queue's key prefix
-- ARGV[2] id
-- ARGV[3] lease token
-- ARGV[4] reason, recorded in the job's error history
-- ARGV[5] dead set max jobs, ARGV[6] dead set max age ms
-- Touches <prefix>unique:<key> (released), <prefix>batch:<batch> (dead += 1), trimmed jobs' hashes, the
-- job's limit slots (given back: includes/release_slots.lua).
-- Returns 1 when moved, 2 when moved and jobs waited for it (their entry is in <prefix>settled: the caller
-- settles them now rather than at its next pass), 0 when the lease was lost (nothing changed). A job others
-- wait for while <prefix>settled holds another type is refused (includes/tell_dependents.lua, untold_refusal):
-- nothing changed, and the reply names the key.

--- @include "now_ms"
--- @include "holds_lease"
--- @include "move_to_dead"
--- @include "wrong_type"
--- @include "release_slots"

local refused = wrong_type({KEYS[1], 'zset', KEYS[2], 'zset'})
if refused then return refused end

local prefix, id, token = ARGV[1], ARGV[2], ARGV[3]
local held, fields = holds_lease(KEYS[3], token, 'slots', 'dependents')
if not held then return 0 end
-- Before the first write: a job others wait for is not killed while it could not tell them.
refused = untold_refusal(prefix, fields[4])
if refused then return refused end
redis.call('ZREM', KEYS[1], id)
release_slots(prefix, id, fields[3])
local left = move_to_dead(prefix, KEYS[2], KEYS[3], id, now_ms(), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]))
return left and 2 or 1
