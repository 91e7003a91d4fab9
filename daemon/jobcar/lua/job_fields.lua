#!lua flags=no-writes
-- job_fields: chosen fields of many jobs of one queue in one call (read-only), for the operators' listings:
-- what the dashboard filters and groups by, without a round trip's worth of client work per job.
--
-- KEYS[1] <prefix>job:  not read: it names the queue's slot (each job's key is built from the prefix)
-- ARGV[1] the queue's key prefix
-- ARGV[2] n, the number of fields; ARGV[3..2+n] the fields; ARGV[3+n..] the job ids
-- Returns for each id, in order, its n values (false where the job or the field is missing, and for a key of
-- another type: one bad key hides that job, never the others), flat.

--- @include "keys"

local prefix, n = ARGV[1], tonumber(ARGV[2])
local fields = {}
for i = 1, n do
  fields[i] = ARGV[2 + i]
end
local out = {}
for i = 3 + n, #ARGV do
  local values = redis.pcall('HMGET', job_key_of(prefix, ARGV[i]), unpack(fields))
  for j = 1, n do
    out[#out + 1] = not values.err and values[j]
  end
end
return out
