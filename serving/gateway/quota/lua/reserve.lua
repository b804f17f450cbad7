-- Reserve for one request, all or nothing (QuotaStore.try_reserve), in one atomic step.
-- ARGV: now, wall ('' ''), lease id, ttl, prompt tokens, max tokens; then per scope its
-- name and limits: max concurrency, requests/min, tokens/min, tokens/day, tokens/month
-- ('' for none).
-- Reply: {'admitted', head, reclaimed, expires_at, {requests, tokens} in each window after
-- the booking, per scope}, or {'refused', head, reclaimed, state reply per scope} (what
-- decision.decide needs to name the refusal), or {'cancelled'} for a reservation that was
-- given up on (its answer was lost) before it arrived here.
-- head: {now, wall, bucket, day, month}.
local now, wall = clock(ARGV[1], ARGV[2])
local id, ttl = ARGV[3], tonumber(ARGV[4])
local tokens = tonumber(ARGV[5]) + tonumber(ARGV[6])
local bucket = math.floor(now)
local day, month = utc_periods(wall)
local head = {fmt(now), fmt(wall), bucket, day, month}

if redis.call('HEXISTS', prefix .. 'ended', id) == 1 then
  return {'cancelled'}
end
local reclaimed = reclaim(now, bucket, 64)

-- decision.decide's admit condition, limit by limit, over every scope before booking any.
local scopes, states, admit = {}, {}, true
for i = 7, #ARGV, 6 do
  local state = scope_read(ARGV[i], bucket, day, month, true)
  if exceeds(state.in_flight + 1, ARGV[i + 1]) or exceeds(state.req_used + 1, ARGV[i + 2])
      or exceeds(state.tok_used + tokens, ARGV[i + 3])
      or exceeds(state.today + tokens, ARGV[i + 4])
      or exceeds(state.month + tokens, ARGV[i + 5]) then
    admit = false
  end
  scopes[#scopes + 1] = ARGV[i]
  states[#states + 1] = state
end

if not admit then
  local reply = {'refused', head, reclaimed}
  for _, state in ipairs(states) do
    reply[#reply + 1] = state_reply(state)
  end
  return reply
end

local reply = {'admitted', head, reclaimed, fmt(now + ttl)}
for i, scope in ipairs(scopes) do
  local base = prefix .. scope
  redis.call('HINCRBY', base .. ':n', 'f', 1)
  period_add(base .. ':n', 'd', 'ds', day, tokens)
  period_add(base .. ':n', 'm', 'ms', month, tokens)
  redis.call('EXPIRE', base .. ':n', KEEP_STATE_S)
  redis.call('HINCRBY', base .. ':r', int(bucket), 1)
  redis.call('HINCRBY', base .. ':t', int(bucket), tokens)
  redis.call('EXPIRE', base .. ':r', KEEP_WINDOW_S)
  redis.call('EXPIRE', base .. ':t', KEEP_WINDOW_S)
  reply[#reply + 1] = {states[i].req_used + 1, states[i].tok_used + tokens}
end
local record = cjson.encode({s = scopes, p = tonumber(ARGV[5]), x = tonumber(ARGV[6]),
  b = bucket, d = day, m = month})
redis.call('HSET', prefix .. 'leases', id, record)
redis.call('ZADD', prefix .. 'expiry', fmt(now + ttl), id)
return reply
