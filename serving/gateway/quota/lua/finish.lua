-- End a lease by id (QuotaStore.finish), at most once: a second call changes nothing.
-- ARGV: now, wall ('' ''), lease id, charged tokens, cancel ('1': the id is a reservation
-- whose answer was lost; if it never arrived, make sure it never books anything).
-- Reply: {1, false} when this call ended it; {0, ending} when it had ended already, with
-- how ('expired:<tokens>', 'cancelled:0') if that is still known, else false.
local now = clock(ARGV[1], ARGV[2])
local id = ARGV[3]
local raw = redis.call('HGET', prefix .. 'leases', id)
if not raw then
  local ending = redis.call('HGET', prefix .. 'ended', id)
  if not ending and ARGV[5] == '1' then
    tombstone(id, 'cancelled:0', now)
  end
  return {0, ending}
end
lease_end(id, cjson.decode(raw), tonumber(ARGV[4]), math.floor(now))
return {1, false}
