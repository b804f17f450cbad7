-- Read scopes' counters, changing nothing else (QuotaStore.status and usage).
-- Own key: the key id's lease hash. Own ARGV: scope names.
-- Reply: {head, state reply per scope}.
local p = prefix_of(own_key(1))
local bucket = math.floor(now)
local day, month = utc_periods(wall)
local reply = {{fmt(now), fmt(wall), bucket, day, month}}
for i = OWN_ARGS + 1, #ARGV do
  reply[#reply + 1] = state_reply(scope_view(p, ARGV[i], bucket, day, month))
end
return answer(reply)
