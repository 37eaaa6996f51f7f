-- The unexpired lease on a run, judged by this server's clock.
-- KEYS[1] the lease hash.
-- Returns {holder, tenant, fence, expires_at}, or an empty array when there is none.
local lease_key = KEYS[1]

local now = server_now()

local current = redis.call('HMGET', lease_key, 'holder', 'tenant', 'fence', 'expires_at')
if current[1] and current[4] and tonumber(current[4]) > now then
    return current
end
return {}
