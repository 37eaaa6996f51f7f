-- The unexpired lease on a run, judged by this server's clock.
-- KEYS[1] the lease hash.
-- Returns {holder, tenant, fence, expires_at, cancel_by, cancel_why} (the two last false unless
-- someone asked the holder to cancel the run), or an empty array when there is none.
local lease_key = KEYS[1]

local now = server_now()

local current = redis.call(
    'HMGET', lease_key, 'holder', 'tenant', 'fence', 'expires_at', 'cancel_by', 'cancel_why')
if current[1] and current[4] and tonumber(current[4]) > now then
    return current
end
return {}
