-- An error reply when a key holds another Redis type than the script expects, else nil. Scripts check
-- the queue's keys they write before their first write: a script that fails half-way keeps the writes it
-- made. `expected` lists key, type, key, type...; an absent key is fine. The reply is a refusal, not an
-- outage: the daemon logs it and leaves the queue aside; `jobcar fsck --repair` removes the key. The wake
-- list needs no check: `wake` leaves any existing key alone, and `lease` deletes it whatever it holds.
local function wrong_type(expected)
  for i = 1, #expected, 2 do
    local found = redis.call('TYPE', expected[i]).ok
    if found ~= 'none' and found ~= expected[i + 1] then
      return redis.error_reply('WRONGTYPE jobcar: ' .. expected[i] .. ' holds a ' .. found .. ', not a ' ..
        expected[i + 1] .. '; jobcar fsck finds it and repairs it')
    end
  end
  return nil
end
