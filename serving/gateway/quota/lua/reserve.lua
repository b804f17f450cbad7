-- Reserve for one request, all or nothing (QuotaStore.try_reserve), in one atomic step,
-- after the prelude ended the leases queued for ending (so a request that just ended has
-- freed its slot for this one).
-- Own key: the key id's lease hash. Own ARGV: lease id, ttl, prompt tokens, max tokens, the
-- index set to add the key id to ('' if it is there already), the key id; then per scope
-- its name and limits:
-- max concurrency, requests/min, tokens/min, tokens/day, tokens/month ('' for none).
-- Reply: {'admitted', head, reclaimed, expires_at, {requests, tokens} in each window after
-- the booking, per scope}, or {'refused', head, reclaimed, state reply per scope} (what
-- decision.decide needs to name the refusal), or {'cancelled'} for a reservation that was
-- given up on (its answer was lost) before it arrived here.
-- head: {now, wall, bucket, day, month}.
local p = prefix_of(own_key(1))
local id, ttl = arg(1), tonumber(arg(2))
local prompt, max_tokens = tonumber(arg(3)), tonumber(arg(4))
-- Every bound before this reservation's first write (store.check_reservation checks the same
-- in the replica): a value no counter holds exactly would make HINCRBY fail half-way.
local function count(x)
  return x ~= nil and x >= 0 and x == math.floor(x) and x <= MAX_RESERVATION
end
if not (count(prompt) and count(max_tokens) and count(prompt + max_tokens)
    and ttl ~= nil and ttl > 0 and ttl < math.huge) then
  return redis.error_reply('ERR reservation out of range')
end
local tokens = prompt + max_tokens
local bucket = math.floor(now)
local day, month = utc_periods(wall)
local head = {fmt(now), fmt(wall), bucket, day, month}

if redis.call('HEXISTS', p .. 'ended', id) == 1 then
  return answer({'cancelled'})
end
if arg(5) ~= '' then
  redis.call('SADD', arg(5), arg(6))
end
local reclaimed = reclaim(p, now, bucket, 64)

-- decision.decide's admit condition, limit by limit, over every scope before booking any.
local scopes, states, admit = {}, {}, true
for i = OWN_ARGS + 7, #ARGV, 6 do
  local state = scope_read(p, ARGV[i], bucket, day, month)
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
  -- decision.decide names the refusal and its wait from every bucket: read them now.
  local reply = {'refused', head, reclaimed}
  for _, scope in ipairs(scopes) do
    reply[#reply + 1] = state_reply(scope_view(p, scope, bucket, day, month))
  end
  return answer(reply)
end

local reply = {'admitted', head, reclaimed, fmt(now + ttl)}
for i, scope in ipairs(scopes) do
  local base, state = p .. scope, states[i]
  redis.call('HINCRBY', base .. ':n', 'f', 1)
  period_add(base .. ':n', 'd', 'ds', day, tokens, state.day)
  period_add(base .. ':n', 'm', 'ms', month, tokens, state.month_name)
  redis.call('EXPIRE', base .. ':n', KEEP_STATE_S)
  window_add(base .. ':req', bucket, 1, state.req_low)
  window_add(base .. ':tok', bucket, tokens, state.tok_low)
  reply[#reply + 1] = {state.req_used + 1, state.tok_used + tokens}
end
local record = cjson.encode({s = scopes, p = tonumber(arg(3)), x = tonumber(arg(4)),
  b = bucket, d = day, m = month})
redis.call('HSET', p .. 'leases', id, record)
redis.call('ZADD', p .. 'expiry', fmt(now + ttl), id)
return answer(reply)
