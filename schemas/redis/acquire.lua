-- Take a run's lease unless another holder has an unexpired one.
-- KEYS[1] the lease hash, KEYS[2] the run's fence counter (never expires, only goes up).
-- ARGV[1] holder, ARGV[2] tenant, ARGV[3] ttl in milliseconds, ARGV[4] cleanup grace in ms.
-- Returns {1, fence, expires_at} when taken, {0, holder, expires_at, tenant} when refused (the
-- tenant of the lease in the way); expires_at is a string of seconds since the epoch by this
-- server's clock (TIME), never the caller's.
local lease_key, fence_key = KEYS[1], KEYS[2]
local holder, tenant = ARGV[1], ARGV[2]
local ttl_ms, grace_ms = tonumber(ARGV[3]), tonumber(ARGV[4])

local now = server_now()

local current = redis.call('HMGET', lease_key, 'holder', 'expires_at', 'tenant')
if current[1] and current[2] and tonumber(current[2]) > now then
    return {0, current[1], current[2], current[3] or ''}
end

local fence = redis.call('INCR', fence_key)
local expires_at = string.format('%.6f', now + ttl_ms / 1000)
redis.call('DEL', lease_key)
redis.call('HSET', lease_key, 'holder', holder, 'tenant', tenant, 'fence', fence,
    'expires_at', expires_at)
redis.call('PEXPIRE', lease_key, ttl_ms + grace_ms)
return {1, tostring(fence), expires_at}
