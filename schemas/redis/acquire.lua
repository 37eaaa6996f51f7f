-- Take a run's lease unless another holder has an unexpired one.
-- KEYS[1] the lease hash, KEYS[2] the run's fence counter (never expires, only goes up).
-- ARGV[1] holder, ARGV[2] tenant, ARGV[3] ttl in milliseconds, ARGV[4] cleanup grace in ms.
-- A cancel ask a holder that let go (or lapsed) never heard is kept and handed to this one.
-- Returns {1, fence, expires_at, cancel_by, cancel_why} when taken (the two last false unless
-- someone asked to cancel the run), {0, holder, expires_at, tenant} when refused (the
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
local asked = redis.call('HMGET', lease_key, 'cancel_by', 'cancel_why')
redis.call('DEL', lease_key)
redis.call('HSET', lease_key, 'holder', holder, 'tenant', tenant, 'fence', fence,
    'expires_at', expires_at)
if asked[1] then
    -- No cleanup expiry: the ask must wait for whoever takes the run next, however late.
    redis.call('HSET', lease_key, 'cancel_by', asked[1], 'cancel_why', asked[2] or '')
else
    redis.call('PEXPIRE', lease_key, ttl_ms + grace_ms)
end
return {1, tostring(fence), expires_at, asked[1], asked[2]}
