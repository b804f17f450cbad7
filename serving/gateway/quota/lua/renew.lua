-- Push an active lease's expiry to now + ttl (QuotaStore.renew).
-- ARGV: now, wall ('' ''), lease id, ttl.
-- Reply: {1, expires_at}, or {0, ending} when it had ended (as finish.lua says it).
local now = clock(ARGV[1], ARGV[2])
local id = ARGV[3]
if redis.call('HEXISTS', prefix .. 'leases', id) == 0 then
  return {0, redis.call('HGET', prefix .. 'ended', id)}
end
local expires = now + tonumber(ARGV[4])
redis.call('ZADD', prefix .. 'expiry', fmt(expires), id)
return {1, fmt(expires)}
