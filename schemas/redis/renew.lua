-- Extend a lease that is still this holder's, under this fence, and unexpired.
-- KEYS[1] the lease hash.
-- ARGV[1] holder, ARGV[2] fence, ARGV[3] ttl in milliseconds, ARGV[4] cleanup grace in ms.
-- Returns {1, expires_at, cancel_by, cancel_why} when extended (the two last false unless someone
-- asked the holder to cancel the run), {0, reason} when the lease is lost.
local lease_key = KEYS[1]
local holder, fence = ARGV[1], tonumber(ARGV[2])
local ttl_ms, grace_ms = tonumber(ARGV[3]), tonumber(ARGV[4])

local now = server_now()
local held, why = held_until(lease_key, holder, fence, now)
if not held then
    return {0, why}
end

local expires_at = string.format('%.6f', now + ttl_ms / 1000)
redis.call('HSET', lease_key, 'expires_at', expires_at)
local asked = redis.call('HMGET', lease_key, 'cancel_by', 'cancel_why')
if not asked[1] then  -- an asked run's hash keeps its ask until the run is collected
    redis.call('PEXPIRE', lease_key, ttl_ms + grace_ms)
end
return {1, expires_at, asked[1], asked[2]}
