-- One replica's report of its demand, and its claim on the engines' slots, in one atomic step
-- (serving/gateway/shared_slots.py). The sum of the live replicas' claims never exceeds the
-- slots: a claim grows only into what the others do not claim, and never drops below what the
-- replica runs. A replica that stops reporting is forgotten when its entry expires.
--
-- KEYS[1] replicas: zset, replica -> expiry (ms, Redis's clock)
-- KEYS[2] claims:   hash, replica -> slots claimed
-- KEYS[3] demand:   hash, replica -> its demand (JSON, read by the replicas only)
-- ARGV: replica, ttl ms, engine slots, seats running there, its target, its demand
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local me, ttl = ARGV[1], tonumber(ARGV[2])
local total, running, target = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('ZREM', KEYS[1], gone)
  redis.call('HDEL', KEYS[2], gone)
  redis.call('HDEL', KEYS[3], gone)
end
redis.call('ZADD', KEYS[1], now + ttl, me)

local others = 0
local claims = redis.call('HGETALL', KEYS[2])
for i = 1, #claims, 2 do
  if claims[i] ~= me then
    others = others + tonumber(claims[i + 1])
  end
end
local claim = math.max(running, math.min(target, total - others))
redis.call('HSET', KEYS[2], me, claim)
redis.call('HSET', KEYS[3], me, ARGV[6])
-- Everything goes when the last replica has been gone a while.
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, 2 * ttl)
end
return {claim, redis.call('HGETALL', KEYS[3])}
