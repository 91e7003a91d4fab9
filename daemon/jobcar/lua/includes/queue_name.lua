-- The queue's name in its key prefix "<ns>:{<queue>}:", or nil for a prefix of another shape (built by
-- hand: queue names hold no brace).
local function queue_name(prefix)
  return string.match(prefix, '{([^{}]*)}:$')
end
