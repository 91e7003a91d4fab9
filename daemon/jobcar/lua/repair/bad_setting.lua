#!lua flags=allow-oom
-- repair/bad_setting: a field of the queue's settings that the enqueue script cannot use as the daemons write
-- it (a max_pending or max_pending:<type> that is not a whole number of at least 1, a refused that is not a
-- count) is deleted: the daemons serving the queue write the bound again at their next start or reload, the
-- count starts from 0.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix.
-- ARGV[2] the field, whatever its name (fsck's checks name which: `_SETTINGS` of fsck/checks.py), ARGV[3] the
-- value it held when checked.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"

local key, field, seen = settings_key_of(ARGV[1]), ARGV[2], ARGV[3]
if redis.call('TYPE', key).ok ~= 'hash' or redis.call('HGET', key, field) ~= seen then return 0 end
redis.call('HDEL', key, field)
return 1
