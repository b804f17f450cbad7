-- Push an active lease's expiry to now + ttl (QuotaStore.renew).
-- Own key: the lease's key id's lease hash. Own ARGV: lease id, ttl.
-- Reply: {1, expires_at}, or {0, ending} when it had ended (as the prelude reports it).
local p = prefix_of(own_key(1))
local id = arg(1)
if redis.call('HEXISTS', p .. 'leases', id) == 0 then
  return answer({0, redis.call('HGET', p .. 'ended', id)})
end
local expires = now + tonumber(arg(2))
redis.call('ZADD', p .. 'expiry', fmt(expires), id)
return answer({1, fmt(expires)})
