-- Prepended to every quota script (redis_scripts.py): the clock, the calendar, the sliding
-- minute and the counters of a scope, mirroring windows.py and decision.py.
--
-- KEYS[1] is the key id's lease hash, `<ns>:{<key id>}:leases`; every other key a script
-- touches is named from the same prefix, so all of them carry the key id's hash tag and sit
-- in one cluster slot. Per scope (`k` for the key, `m:<model>` for key+model):
--   <prefix><scope>:n   hash: f (requests in flight), d/ds (UTC day, tokens spent in it),
--                       m/ms (UTC month, tokens spent in it)
--   <prefix><scope>:r   hash: 1 s bucket -> requests admitted in it
--   <prefix><scope>:t   hash: 1 s bucket -> tokens booked in it (reservations, then charges)
-- Per key id: leases (hash id -> record), expiry (sorted set id -> expiry), ended and
-- ended-at (how leases nobody ended or given-up reservations ended, and when, for a day).

local WINDOW = 60                 -- a bucket counts while it is one of the 61 newest
local KEEP_WINDOW_S = 62          -- a window hash is empty this long after its last booking
local KEEP_STATE_S = 40 * 86400   -- longer than a month: a month's budget outlives quiet days
local KEEP_ENDED_S = 86400        -- how long a late finish still learns how its lease ended

local prefix = string.sub(KEYS[1], 1, -7)  -- KEYS[1] minus 'leases'

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

-- A minute window seen from `bucket`: what it holds and its buckets in the span, oldest
-- first ({bucket, amount} pairs); fields older than the span are deleted when `prune`.
local function window_read(key, bucket, prune)
  local flat = redis.call('HGETALL', key)
  local used, buckets, stale = 0, {}, {}
  for i = 1, #flat, 2 do
    local b = tonumber(flat[i])
    if b >= bucket - WINDOW then
      local amount = tonumber(flat[i + 1])
      used = used + amount
      buckets[#buckets + 1] = {b, amount}
    else
      stale[#stale + 1] = flat[i]
    end
  end
  if prune and #stale > 0 then
    redis.call('HDEL', key, unpack(stale))
  end
  table.sort(buckets, function(x, y) return x[1] < y[1] end)
  return used, buckets
end

-- A settlement corrects the bucket its reservation was booked in, unless that bucket has
-- left the window (then it no longer counts against anything).
local function window_correct(key, booked, bucket, delta)
  if booked >= bucket - WINDOW and redis.call('HEXISTS', key, int(booked)) == 1 then
    redis.call('HINCRBY', key, int(booked), delta)
  end
end

-- A period counter holds one period (a day or a month) and starts again at 0 when the
-- period changes; a correction for a period already over is dropped (windows.PeriodCounter).
local function spent_in(name, spent, period)
  if name ~= period then
    return 0
  end
  return tonumber(spent) or 0
end

local function period_add(key, name_field, spent_field, period, amount)
  local name = redis.call('HGET', key, name_field)
  if name ~= period then
    if name and period < name then
      return
    end
    redis.call('HSET', key, name_field, period, spent_field, 0)
  end
  redis.call('HINCRBY', key, spent_field, amount)
end

-- One scope's counters, as decision.ScopeState holds them.
local function scope_read(scope, bucket, day, month, prune)
  local base = prefix .. scope
  local counters = redis.call('HMGET', base .. ':n', 'f', 'd', 'ds', 'm', 'ms')
  local state = {
    in_flight = tonumber(counters[1]) or 0,
    today = spent_in(counters[2], counters[3], day),
    month = spent_in(counters[4], counters[5], month),
  }
  state.req_used, state.req = window_read(base .. ':r', bucket, prune)
  state.tok_used, state.tok = window_read(base .. ':t', bucket, prune)
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

local function tombstone(id, ending, now)
  redis.call('HSET', prefix .. 'ended', id, ending)
  redis.call('ZADD', prefix .. 'ended-at', fmt(now), id)
end

-- End lease `id` (its record `rec`): free its slot in each of its scopes and replace its
-- reservation by `charge` in the bucket, day and month it was booked in.
local function lease_end(id, rec, charge, bucket)
  redis.call('HDEL', prefix .. 'leases', id)
  redis.call('ZREM', prefix .. 'expiry', id)
  local delta = charge - (rec.p + rec.x)
  for _, scope in ipairs(rec.s) do
    local base = prefix .. scope
    redis.call('HINCRBY', base .. ':n', 'f', -1)
    if delta ~= 0 then
      window_correct(base .. ':t', rec.b, bucket, delta)
      period_add(base .. ':n', 'd', 'ds', rec.d, delta)
      period_add(base .. ':n', 'm', 'ms', rec.m, delta)
    end
  end
end

-- End up to `limit` of this key id's leases past their expiry. Nobody reported usage, so
-- each keeps its whole reservation charged. Returns {id, charge, id, charge, ...}.
local function reclaim(now, bucket, limit)
  local ids = redis.call('ZRANGEBYSCORE', prefix .. 'expiry', '-inf', fmt(now), 'LIMIT', 0, limit)
  local reclaimed = {}
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', prefix .. 'leases', id)
    if raw then
      local rec = cjson.decode(raw)
      local charge = rec.p + rec.x
      lease_end(id, rec, charge, bucket)
      tombstone(id, 'expired:' .. charge, now)
      reclaimed[#reclaimed + 1] = id
      reclaimed[#reclaimed + 1] = charge
    else
      redis.call('ZREM', prefix .. 'expiry', id)
    end
  end
  local old = redis.call('ZRANGEBYSCORE', prefix .. 'ended-at', '-inf', fmt(now - KEEP_ENDED_S),
    'LIMIT', 0, limit)
  if #old > 0 then
    redis.call('HDEL', prefix .. 'ended', unpack(old))
    redis.call('ZREM', prefix .. 'ended-at', unpack(old))
  end
  return reclaimed
end

-- Whether `value` goes over a limit given as an argument ('' is no limit).
local function exceeds(value, limit)
  return limit ~= '' and value > tonumber(limit)
end
