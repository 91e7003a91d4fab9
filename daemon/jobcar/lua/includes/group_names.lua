-- The names of the limit groups (ADR 0014), made and read here and nowhere else in the scripts, as
-- daemon/jobcar/limit_groups.py makes and reads them for the daemon (tests/unit/test_group_names.py holds
-- the two together):
--   "<type>"                       a type's total (a concurrency group)
--   "<type>#<key>"                 a key's slots of its type (a concurrency group)
--   "@<type>", "@<type>#<key>"     a rate group, of the type or of a key
--   "~<type>#<key>"                a key's turn for its type's total (`fair`; key "" for a job without one)
-- A job type has no '#', '@' or '~' (names.py), so a name's first '#' ends its type; a key is any text. The
-- names that are one line are inlined by jobcar's loader (scripts.py): a name costs what it cost written out.
local function key_group(job_type, key) return job_type .. '#' .. key end
local function rate_group(job_type) return '@' .. job_type end
local function key_rate_group(job_type, key) return '@' .. job_type .. '#' .. key end
local function turn_group(job_type, key) return '~' .. job_type .. '#' .. key end
local function is_turn_group(group) return string.sub(group, 1, 1) == '~' end
-- Whether a concurrency group is a key's (a type's total has no key).
local function names_a_key(group) return string.find(group, '#', 1, true) ~= nil end
-- The type of a job's `slots` field: the names of its groups one per line, all of its type.
local function type_of_slots(slots) return string.match(slots, '^[^#\n]+') end

-- A group's kind ("concurrency", "rate" or "turn"), its type and its key (nil for a group of the whole type).
local function group_parts(group)
  local mark, job_type, hash, key = string.match(group, '^([@~]?)([^#]*)(#?)(.*)$')
  local kind = mark == '@' and 'rate' or mark == '~' and 'turn' or 'concurrency'
  if hash == '' then return kind, job_type, nil end
  return kind, job_type, key
end
