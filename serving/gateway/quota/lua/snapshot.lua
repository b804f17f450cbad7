-- Read scopes' counters, changing nothing (QuotaStore.status and usage).
-- ARGV: now, wall ('' ''), then scope names. Reply: {head, state reply per scope}.
local now, wall = clock(ARGV[1], ARGV[2])
local bucket = math.floor(now)
local day, month = utc_periods(wall)
local reply = {{fmt(now), fmt(wall), bucket, day, month}}
for i = 3, #ARGV do
  reply[#reply + 1] = state_reply(scope_read(ARGV[i], bucket, day, month, false))
end
return reply
