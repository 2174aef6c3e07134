"""The Lua scripts the batch store runs in Redis: each a step that must happen at once.

A batch's reserved tokens are counted twice, on purpose: in the tenant's total
(`enqueued`, what the queue quota checks) and in the batch's own record (`reserved`, what
it still holds). Every script moves both together and never gives back more than the batch
still holds, so the tenant's total is always the sum of its batches' and never negative,
whatever fails, retries or runs twice.
"""

from __future__ import annotations

# KEYS: the tenant's enqueued tokens, the batch. ARGV: the batch's tokens, the tenant's
# limit. Reserves them when they fit; returns -1, or the tokens already enqueued when not,
# or -2 when the batch is no longer validating (cancelled meanwhile): nothing reserved.
RESERVE_CANCELLED = -2
RESERVE_TOKENS = """
if redis.call('HGET', KEYS[2], 'status') ~= 'validating' then return -2 end
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return used end
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[2], 'reserved', ARGV[1])
return -1
"""

# KEYS: the batch, the tenant's enqueued tokens. Gives back what the batch still holds
# (a failed creation, a finished batch); returns how much. Twice is harmless.
RELEASE_TOKENS = """
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0')
if reserved > 0 then
  redis.call('DECRBY', KEYS[2], reserved)
  redis.call('HSET', KEYS[1], 'reserved', 0)
end
return reserved
"""

# KEYS: the batch, the tenant's file sizes. ARGV: the bytes an item's result may take,
# the batch id (its field in the file sizes). Holds them in the tenant's file storage
# before the item runs, when they fit its quota. Returns the bytes held, -1 when they do
# not fit, 0 when the batch is not running (finalizing drops its field: nothing to hold).
RESERVE_BYTES = """
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 0 end
local quota = tonumber(redis.call('HGET', KEYS[1], 'quota_bytes') or '-1')
if quota < 0 then return 0 end
local used = 0
for _, size in ipairs(redis.call('HVALS', KEYS[2])) do
  used = used + tonumber(size)
end
if used + tonumber(ARGV[1]) > quota then return -1 end
redis.call('HINCRBY', KEYS[2], ARGV[2], ARGV[1])
return tonumber(ARGV[1])
"""

# KEYS: result key, batch key, the tenant's enqueued tokens, the tenant's file sizes.
# ARGV: encoded result, outcome counter field, the item's token estimate, the result to
# write instead when this one would take the tenant past its file quota ('' for none),
# the result key's lifetime (s), the batch id (its field in the file sizes), the bytes
# RESERVE_BYTES held for it (0 for none).
# Writes the result only if none exists and the batch is running (a batch cancelled while
# validating never started: its items are dropped), counts it, charges its bytes to the
# tenant's file storage in place of what was held (they become the output and error
# files) and gives its tokens back, all in one step. Returns {written (0/1), settled, total}.
SETTLE = """
local status = redis.call('HGET', KEYS[2], 'status')
if status ~= 'in_progress' and status ~= 'cancelling' then return {0, 0, 0} end
if redis.call('HEXISTS', KEYS[2], 'in_progress_at') == 0 then return {0, 0, 0} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, 0, 0} end
local result, field, held = ARGV[1], ARGV[2], tonumber(ARGV[7])
local quota = tonumber(redis.call('HGET', KEYS[2], 'quota_bytes') or '-1')
if ARGV[4] ~= '' and quota >= 0 then
  local used = 0
  for _, size in ipairs(redis.call('HVALS', KEYS[4])) do
    used = used + tonumber(size)
  end
  -- The backstop for a result larger than what was held for it.
  if used - held + #result > quota then
    result, field = ARGV[4], 'failed'
  end
end
redis.call('SET', KEYS[1], result, 'EX', ARGV[5])
redis.call('HINCRBY', KEYS[4], ARGV[6], #result - held)
redis.call('HINCRBY', KEYS[2], field, 1)
local reserved = tonumber(redis.call('HGET', KEYS[2], 'reserved') or '0')
local give = math.min(reserved, tonumber(ARGV[3]))
if give > 0 then
  redis.call('HINCRBY', KEYS[2], 'reserved', -give)
  redis.call('DECRBY', KEYS[3], give)
end
local settled = redis.call('HINCRBY', KEYS[2], 'settled', 1)
return {1, settled, tonumber(redis.call('HGET', KEYS[2], 'total'))}
"""

# KEYS: batch key. ARGV: now. Moves a validating or in-progress batch to cancelling;
# returns the status it found, so the caller knows which it was.
CANCEL = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'in_progress' or status == 'validating' then
  redis.call('HSET', KEYS[1], 'status', 'cancelling', 'cancelling_at', ARGV[1])
end
return status
"""

# KEYS: batch key. ARGV: field, value pairs. A validating batch goes in progress with
# them; one cancelled meanwhile stays cancelling. Returns the status it found (nil: gone).
START = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'validating' then
  redis.call('HSET', KEYS[1], 'status', 'in_progress', unpack(ARGV))
end
return status
"""

# KEYS: the retry key. ARGV: a new batch id, the window (s), the id a retry found gone
# or failed ('' for none). The batch id a retry should answer with; the new id when this
# create is the first (or replaces the one found unusable).
CLAIM_RETRY = """
local earlier = redis.call('GET', KEYS[1])
if earlier and earlier ~= ARGV[3] then return earlier end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return ARGV[1]
"""
