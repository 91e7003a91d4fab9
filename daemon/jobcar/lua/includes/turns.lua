--- @include "keys"
--- @include "group_names"
--- @include "unpark"

-- Fair limits (`fair`, ADR 0014): keys take turns for their type's total slots. A job the total holds waits
-- in its key's turn group "~<type>#<key>" (key "" for a job without one); <prefix>turns:<type>, a ZSET
-- key -> place, orders the keys with jobs waiting, lowest first. A slot of the type given back lets the
-- first key's oldest job go, and that key goes to the back: a key with 100,000 jobs waiting and a key with
-- 10 alternate.

-- `key` joins its type's turns at the back, unless it has a place already.
local function join_turns(prefix, job_type, key)
  local turns = turns_key_of(prefix, job_type)
  local last = redis.pcall('ZRANGE', turns, -1, -1, 'WITHSCORES')
  if last.err then return end  -- a key of another type: no turns rather than no lease
  redis.call('ZADD', turns, 'NX', (tonumber(last[2]) or 0) + 1, key)
end

-- Let up to n held jobs go, one per key in turn order; each key that had one goes to the back, a key with
-- none left leaves. Returns how many went.
local function next_turns(prefix, job_type, n)
  local turns = turns_key_of(prefix, job_type)
  local moved = 0
  while moved < n do
    local first = redis.pcall('ZRANGE', turns, 0, 0)
    if first.err or #first == 0 then break end
    local key = first[1]
    local group = turn_group(job_type, key)
    local went = unpark(prefix, group, 1)
    moved = moved + went
    -- A key whose list let nothing go (emptied, or a key of another type) leaves: each pass moves a job or
    -- drops a key, so the loop ends.
    if went == 1 and redis.call('EXISTS', held_key_of(prefix, group)) == 1 then
      local last = redis.call('ZRANGE', turns, -1, -1, 'WITHSCORES')
      redis.call('ZADD', turns, 'XX', tonumber(last[2]) + 1, key)
    else
      redis.call('ZREM', turns, key)
    end
  end
  return moved
end

-- A concurrency group's freed slots: up to n of its held jobs go, and for a type's total the keys waiting
-- for their turn take what its own list leaves (a key's group has no turns). Returns how many went.
local function let_go(prefix, group, n)
  local moved = unpark(prefix, group, n)
  if moved < n and not names_a_key(group) then moved = moved + next_turns(prefix, group, n - moved) end
  return moved
end
