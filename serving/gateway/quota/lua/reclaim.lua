-- End up to `limit` of one key id's leases past their expiry (QuotaStore.reclaim_expired).
-- ARGV: now, wall ('' ''), limit. Reply: {id, charge, id, charge, ...}.
local now = clock(ARGV[1], ARGV[2])
return reclaim(now, math.floor(now), tonumber(ARGV[3]))
