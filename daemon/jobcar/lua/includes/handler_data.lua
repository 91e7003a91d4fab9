--- @include "keys"

-- What a job's handlers wrote through the handler API beside its hash (its log, its durable steps, its
-- children: docs/handler-api.md). The hash's `handler_data` field marks a job that has any, so that the ack
-- of every other job pays nothing for it. It goes when the job goes, and expires with a kept job.
local function drop_handler_data(prefix, id)
  redis.call('DEL', log_key_of(prefix, id), steps_key_of(prefix, id), children_key_of(prefix, id))
end

local function expire_handler_data(prefix, id, ms)
  redis.call('PEXPIRE', log_key_of(prefix, id), ms)
  redis.call('PEXPIRE', steps_key_of(prefix, id), ms)
  redis.call('PEXPIRE', children_key_of(prefix, id), ms)
end
