#!lua flags=no-writes
-- step_list: a job's durable steps without their results (a result may be a MiB, and a job may keep a hundred).
--
-- KEYS[1] steps  HASH  <prefix>steps:<id>  name -> "<ms> <result>"
-- Returns name, "<ms>" (when written), the stored value's size, for each step, flat; none for a key of another
-- type (fsck reports it).

if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return {} end
local out = {}
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  local value = redis.call('HGET', KEYS[1], name)
  out[#out + 1] = name
  out[#out + 1] = string.match(value, '^%d*')
  out[#out + 1] = #value
end
return out
