-- Extend a lease that is still this holder's, under this fence, and unexpired.
-- KEYS[1] the lease hash.
-- ARGV[1] holder, ARGV[2] fence, ARGV[3] ttl in milliseconds, ARGV[4] cleanup grace in ms.
-- Returns {1, expires_at} when extended, {0, reason} when the lease is lost.
local lease_key = KEYS[1]
local holder, fence = ARGV[1], tonumber(ARGV[2])
local ttl_ms, grace_ms = tonumber(ARGV[3]), tonumber(ARGV[4])

local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000

local current = redis.call('HMGET', lease_key, 'holder', 'fence', 'expires_at')
if not current[1] then
    return {0, 'released or expired'}
end
if current[1] ~= holder or tonumber(current[2]) ~= fence then
    return {0, 'superseded by fence ' .. current[2] .. ' of ' .. current[1]}
end
if not (tonumber(current[3]) > now) then
    return {0, 'expired'}
end

local expires_at = string.format('%.6f', now + ttl_ms / 1000)
redis.call('HSET', lease_key, 'expires_at', expires_at)
redis.call('PEXPIRE', lease_key, ttl_ms + grace_ms)
return {1, expires_at}
