#!lua flags=allow-oom
-- repair/unique_no_ttl: a unique lock that never expires gets a TTL (its unique_for is unknown).
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix.
-- ARGV[2] the lock's key, ARGV[3] the TTL in ms.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

if redis.call('PTTL', ARGV[2]) ~= -1 then return 0 end
redis.call('PEXPIRE', ARGV[2], ARGV[3])
return 1
