-- Ask the unexpired holding of a tenant's run to end the run cancelled; the first ask is kept.
-- KEYS[1] the lease hash.
-- ARGV[1] tenant, ARGV[2] who asks, ARGV[3] why.
-- Returns {holder, tenant, fence, expires_at, cancel_by, cancel_why} as the holding now is, or an
-- empty array when the run has no unexpired lease of that tenant. The ask outlives the holding
-- (acquisition keeps it, and so does a release by a holder that did not answer it; the hash
-- loses its cleanup expiry) until a holder answers it, or the run's keys are collected (gc.lua)
-- or forgotten (forget.lua).
local lease_key = KEYS[1]
local tenant, by, why = ARGV[1], ARGV[2], ARGV[3]

local now = server_now()

local current = redis.call('HMGET', lease_key, 'holder', 'tenant', 'expires_at')
if not (current[1] and current[3] and tonumber(current[3]) > now and current[2] == tenant) then
    return {}
end
if redis.call('HSETNX', lease_key, 'cancel_by', by) == 1 then
    redis.call('HSET', lease_key, 'cancel_why', why)
    redis.call('PERSIST', lease_key)
end
return redis.call(
    'HMGET', lease_key, 'holder', 'tenant', 'fence', 'expires_at', 'cancel_by', 'cancel_why')
