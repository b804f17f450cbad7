-- End up to `limit` expired leases of each of several key ids (QuotaStore.reclaim_expired):
-- one call for many key ids, instead of one per key id.
-- Own keys: the key ids' lease hashes. Own ARGV: limit.
-- Reply: per key id, {id, charge, id, charge, ...}.
local bucket = math.floor(now)
local limit = tonumber(arg(1))
local reply = {}
for i = ENDINGS + 1, #KEYS do
  reply[#reply + 1] = reclaim(prefix_of(KEYS[i]), now, bucket, limit)
end
return answer(reply)
