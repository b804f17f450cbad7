-- Prepended to every quota script (redis_scripts.py): the clock, the calendar, the sliding
-- minute and the counters of a scope, mirroring windows.py and decision.py; and, run first
-- by every script, the lease endings the calling replica queued (the prelude at the end).
--
-- A key id's keys are all named from its prefix `<ns>:{<key id>}:` (its lease hash,
-- `<prefix>leases`, is what KEYS hold), so they carry the key id's hash tag. Per scope (`k`
-- for the key, `m:<model>` for key+model):
--   <prefix><scope>:n   hash: f (requests in flight), d/ds (UTC day, tokens spent in it),
--                       m/ms (UTC month, tokens spent in it)
--   <prefix><scope>:req hash: 1 s bucket -> requests admitted in it (and 't', 'l': below)
--   <prefix><scope>:tok hash: 1 s bucket -> tokens booked in it (reservations, then charges)
-- Per key id: leases (hash id -> record), expiry (sorted set id -> expiry), ended and
-- ended-at (how leases nobody ended or given-up reservations ended, and when, for a day).

local WINDOW = 60                 -- a bucket counts while it is one of the 61 newest
local KEEP_WINDOW_S = 62          -- a window hash is empty this long after its last booking
local KEEP_STATE_S = 40 * 86400   -- longer than a month: a month's budget outlives quiet days
local KEEP_ENDED_S = 86400        -- how long a late finish still learns how its lease ended
local MAX_RESERVATION = 2 ^ 50     -- store.MAX_RESERVATION: exact in a double and in HINCRBY

-- A key id's prefix, from its lease hash's name.
local function prefix_of(leases_key)
  return string.sub(leases_key, 1, -7)  -- minus 'leases'
end

-- Floats leave as decimal strings with every digit (Redis turns Lua numbers into integers).
local function fmt(x)
  return string.format('%.17g', x)
end

-- Bucket numbers as field names, spelt one way whatever Lua's number formatting.
local function int(x)
  return string.format('%d', x)
end

-- The window clock and the wall clock. Redis's own TIME, so that every replica reads the
-- same clock; tests pass their own (decimal strings; '' for TIME).
local function clock(now_arg, wall_arg)
  if now_arg ~= '' then
    return tonumber(now_arg), tonumber(wall_arg)
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  return now, now
end

-- The UTC day and month of a Unix time, spelt as windows.utc_day/utc_month spell them
-- (Redis's Lua has no os.date): civil_from_days, after Howard Hinnant.
local function utc_periods(wall)
  local z = math.floor(wall / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400 + (month <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02d', year, month, day), string.format('%04d-%02d', year, month)
end

-- A minute window is a hash of 1 s buckets (bucket -> amount) with two fields of its own:
-- 't', what its buckets hold together, and 'l', a bucket number none of its buckets is
-- below. Every access moves 'l' up to the oldest bucket in the span, so all buckets lie in
-- [l, l + WINDOW]: admission reads the total (not every bucket, which a busy key fills, all
-- 61 of them), and pruning removes only the buckets that left since the last access (the
-- whole hash at once after more than a window of quiet).

-- What a window holds as seen from `bucket`, buckets that left the span pruned (and taken
-- off the total). Also returns its 'l' (nil: the window holds nothing yet).
local function window_used(key, bucket)
  local fields = redis.call('HMGET', key, 't', 'l')
  local used, low = tonumber(fields[1]) or 0, tonumber(fields[2])
  local oldest = bucket - WINDOW
  if low == nil or low >= oldest then
    return used, low
  end
  if oldest - low > WINDOW then
    redis.call('DEL', key)  -- every bucket in it is older than the span
    return 0, nil
  end
  local stale = {}
  for b = low, oldest - 1 do
    stale[#stale + 1] = int(b)
  end
  local amounts = redis.call('HMGET', key, unpack(stale))
  for i = 1, #stale do
    used = used - (tonumber(amounts[i]) or 0)
  end
  redis.call('HDEL', key, unpack(stale))
  redis.call('HSET', key, 't', int(used), 'l', int(oldest))
  return used, oldest
end

-- Book `amount` in `bucket` (the current one); `low` is what window_used returned.
local function window_add(key, bucket, amount, low)
  redis.call('HINCRBY', key, int(bucket), amount)
  redis.call('HINCRBY', key, 't', amount)
  if low == nil then
    redis.call('HSET', key, 'l', int(bucket - WINDOW))
  end
  redis.call('EXPIRE', key, KEEP_WINDOW_S)
end

-- A window's buckets in the span seen from `bucket`, oldest first ({bucket, amount} pairs),
-- and what they hold; reads only (what a refusal's wait and `status` need).
local function window_read(key, bucket)
  local flat = redis.call('HGETALL', key)
  local used, buckets = 0, {}
  for i = 1, #flat, 2 do
    local b = tonumber(flat[i])  -- nil for 't' and 'l'
    if b and b >= bucket - WINDOW then
      local amount = tonumber(flat[i + 1])
      used = used + amount
      buckets[#buckets + 1] = {b, amount}
    end
  end
  table.sort(buckets, function(x, y) return x[1] < y[1] end)
  return used, buckets
end

-- A settlement corrects the bucket its reservation was booked in, unless that bucket has
-- left the window (then it no longer counts against anything).
local function window_correct(key, booked, bucket, delta)
  if booked >= bucket - WINDOW and redis.call('HEXISTS', key, int(booked)) == 1 then
    redis.call('HINCRBY', key, int(booked), delta)
    redis.call('HINCRBY', key, 't', delta)
  end
end

-- A period counter holds one period (a day or a month) and starts again at 0 when the
-- period changes; a correction for a period already over is dropped (windows.PeriodCounter).
-- `current` is the period the counter holds now (false: none yet).
local function spent_in(name, spent, period)
  if name ~= period then
    return 0
  end
  return tonumber(spent) or 0
end

local function period_add(key, name_field, spent_field, period, amount, current)
  if current ~= period then
    if current and period < current then
      return
    end
    redis.call('HSET', key, name_field, period, spent_field, 0)
  end
  redis.call('HINCRBY', key, spent_field, amount)
end

-- The counters of scope `scope` of the key id with prefix `p`, for admission: in flight,
-- the day's and month's spending (and which day and month the counters hold) and the
-- minute windows' totals, pruned.
local function scope_read(p, scope, bucket, day, month)
  local base = p .. scope
  local counters = redis.call('HMGET', base .. ':n', 'f', 'd', 'ds', 'm', 'ms')
  local state = {
    in_flight = tonumber(counters[1]) or 0,
    day = counters[2],
    today = spent_in(counters[2], counters[3], day),
    month_name = counters[4],
    month = spent_in(counters[4], counters[5], month),
  }
  state.req_used, state.req_low = window_used(base .. ':req', bucket)
  state.tok_used, state.tok_low = window_used(base .. ':tok', bucket)
  return state
end

-- The same with the windows' buckets (what decision.ScopeState holds), changing nothing.
local function scope_view(p, scope, bucket, day, month)
  local base = p .. scope
  local counters = redis.call('HMGET', base .. ':n', 'f', 'd', 'ds', 'm', 'ms')
  local state = {
    in_flight = tonumber(counters[1]) or 0,
    today = spent_in(counters[2], counters[3], day),
    month = spent_in(counters[4], counters[5], month),
  }
  state.req_used, state.req = window_read(base .. ':req', bucket)
  state.tok_used, state.tok = window_read(base .. ':tok', bucket)
  return state
end

local function flat_buckets(buckets)
  local flat = {}
  for i, pair in ipairs(buckets) do
    flat[2 * i - 1] = pair[1]
    flat[2 * i] = pair[2]
  end
  return flat
end

-- A scope's counters as a reply (redis_store.py reads it back into a ScopeState).
local function state_reply(state)
  return {state.in_flight, state.today, state.month,
    state.req_used, flat_buckets(state.req), state.tok_used, flat_buckets(state.tok)}
end

local function tombstone(p, id, ending, now)
  redis.call('HSET', p .. 'ended', id, ending)
  redis.call('ZADD', p .. 'ended-at', fmt(now), id)
end

-- End lease `id` (its record `rec`) of the key id with prefix `p`: free its slot in each of
-- its scopes and replace its reservation by `charge` in the bucket, day and month it was
-- booked in; `withdraw`: the request also leaves the requests window (LeaseState.WITHDRAWN).
local function lease_end(p, id, rec, charge, bucket, withdraw)
  redis.call('HDEL', p .. 'leases', id)
  redis.call('ZREM', p .. 'expiry', id)
  local delta = charge - (rec.p + rec.x)
  for _, scope in ipairs(rec.s) do
    local base = p .. scope
    redis.call('HINCRBY', base .. ':n', 'f', -1)
    if withdraw then
      window_correct(base .. ':req', rec.b, bucket, -1)
    end
    if delta ~= 0 then
      window_correct(base .. ':tok', rec.b, bucket, delta)
      local current = redis.call('HMGET', base .. ':n', 'd', 'm')
      period_add(base .. ':n', 'd', 'ds', rec.d, delta, current[1])
      period_add(base .. ':n', 'm', 'ms', rec.m, delta, current[2])
    end
  end
end

-- End up to `limit` of the leases past their expiry of the key id with prefix `p`. Nobody
-- reported usage, so each keeps its whole reservation charged.
-- Returns {id, charge, id, charge, ...}.
local function reclaim(p, now, bucket, limit)
  local ids = redis.call('ZRANGEBYSCORE', p .. 'expiry', '-inf', fmt(now), 'LIMIT', 0, limit)
  local reclaimed = {}
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', p .. 'leases', id)
    if raw then
      local rec = cjson.decode(raw)
      local charge = rec.p + rec.x
      lease_end(p, id, rec, charge, bucket, false)
      tombstone(p, id, 'expired:' .. charge, now)
      reclaimed[#reclaimed + 1] = id
      reclaimed[#reclaimed + 1] = charge
    else
      redis.call('ZREM', p .. 'expiry', id)
    end
  end
  local old = redis.call('ZRANGEBYSCORE', p .. 'ended-at', '-inf', fmt(now - KEEP_ENDED_S),
    'LIMIT', 0, limit)
  if #old > 0 then
    redis.call('HDEL', p .. 'ended', unpack(old))
    redis.call('ZREM', p .. 'ended-at', unpack(old))
  end
  return reclaimed
end

-- Whether `value` goes over a limit given as an argument ('' is no limit).
local function exceeds(value, limit)
  return limit ~= '' and value > tonumber(limit)
end

-- The prelude, run first by every script: end the leases the calling replica queued
-- (redis_store.py: a request's settle rides on its replica's next call), so a script sees
-- every ending its replica knew of when it sent it, and a request that ended frees its slot
-- for the next one. Each ending happens at most once: a lease that had ended already
-- (expired, ended by another call) is left alone and reported.
-- ARGV: now, wall ('' '': Redis's TIME), the number of endings n, then per ending: lease
-- id, charged tokens, mode ('1' cancel: a reservation whose answer was lost; if it never
-- arrived, make sure it never books anything; '2' withdraw: see lease_end; '0' neither). KEYS[i] is ending i's lease hash. The operation's own
-- arguments follow (`arg(1)`, ...), and its own keys (`own_key(1)`, ...).
local now, wall = clock(ARGV[1], ARGV[2])
local ENDINGS = tonumber(ARGV[3])
local OWN_ARGS = 3 + 3 * ENDINGS
-- Endings that found their lease ended already: {index, how it ended ('expired:<tokens>',
-- 'cancelled:0'; false once that is forgotten), ...}.
local already = {}
for i = 1, ENDINGS do
  local at = 3 + 3 * (i - 1)
  local p = prefix_of(KEYS[i])
  local id = ARGV[at + 1]
  local raw = redis.call('HGET', p .. 'leases', id)
  if raw then
    lease_end(p, id, cjson.decode(raw), tonumber(ARGV[at + 2]), math.floor(now),
      ARGV[at + 3] == '2')
  else
    local ending = redis.call('HGET', p .. 'ended', id)
    if not ending and ARGV[at + 3] == '1' then
      tombstone(p, id, 'cancelled:0', now)
    end
    already[#already + 1] = i
    already[#already + 1] = ending
  end
end

local function arg(i)
  return ARGV[OWN_ARGS + i]
end

local function own_key(i)
  return KEYS[ENDINGS + i]
end

-- Every script answers {endings found ended already, its own reply}.
local function answer(reply)
  return {already, reply}
end
