-- Append one entry to the job's bounded error history (a JSON array in the "errors" field).
local MAX_ERRORS_KEPT = 20
local function record_error(job_key, attempt, now, message)
  local raw = redis.call('HGET', job_key, 'errors')
  local errors = {}
  if raw then errors = cjson.decode(raw) end
  errors[#errors + 1] = {attempt = attempt, at = now, error = message}
  while #errors > MAX_ERRORS_KEPT do table.remove(errors, 1) end
  redis.call('HSET', job_key, 'errors', cjson.encode(errors))
end
