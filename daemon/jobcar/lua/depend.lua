#!lua flags=allow-oom
-- depend: register a waiting job with one of its dependencies, on the dependency's slot (ADR 0016). The
-- producer stored the waiting job first (enqueue with `after`), then calls this once per dependency.
--
-- KEYS[1] the dependency's job HASH  <prefix>job:<id>
-- ARGV[1] the dependency's queue key prefix
-- ARGV[2] the dependency's id
-- ARGV[3] the waiting job's reference "<queue>/<id>"
-- Touches <prefix>dependents:<id> SET (the reference added), the dependency's `dependents` field.
-- Returns what the waiting job must be told now:
--   "registered"   the dependency has not ended: it tells the waiting job when it does
--   "done" | "dead" | "canceled"  it ended already (its hash is kept: a result_ttl, the dead-letter set)
--   "gone"         no such job (it succeeded or was canceled without a kept hash, or never existed)

--- @include "keys"

local state = redis.pcall('HGET', KEYS[1], 'state')
if type(state) ~= 'string' then return 'gone' end
if state == 'done' or state == 'dead' or state == 'canceled' then return state end
redis.call('SADD', dependents_key_of(ARGV[1], ARGV[2]), ARGV[3])
redis.call('HSET', KEYS[1], 'dependents', '1')
return 'registered'
