#!lua flags=allow-oom
-- progress: keep the latest progress a running job's handler reported (the handler API).
--
-- KEYS[1] job  HASH  <prefix>job:<id>
-- ARGV[1] the attempt's lease token
-- ARGV[2] the progress, a JSON object {"percent"?, "message"?, "at", "attempt"} (checked by the caller)
-- Touches the job's `progress` field.
-- Returns "ok", or why it was refused ("lease lost", "canceled"): then nothing changed.

--- @include "attempt_refusal"

local refused = attempt_refusal(KEYS[1], ARGV[1])
if refused then return refused end
redis.call('HSET', KEYS[1], 'progress', ARGV[2])
return 'ok'
