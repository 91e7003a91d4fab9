-- Why the handler API refuses a write of an attempt, or nil: the attempt must still hold the job's lease (the
-- job is active under its token), and the job must not have been canceled meanwhile. Fenced like every
-- other write of an attempt: a handler whose lease was lost writes nothing.
local function attempt_refusal(job_key, token)
  local fields = redis.pcall('HMGET', job_key, 'state', 'token', 'cancel')
  if fields.err or fields[1] ~= 'active' or fields[2] ~= token then return 'lease lost' end
  if fields[3] then return 'canceled' end
  return nil
end
