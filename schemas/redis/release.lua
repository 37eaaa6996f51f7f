-- Hand a lease back. The fence counter is left alone, so the next acquisition still raises it,
-- and so is a cancel ask the holder never heard, which the next acquisition hands to its holder.
-- KEYS[1] the lease hash, KEYS[2] the run's fence counter.
-- ARGV[1] holder, ARGV[2] fence, ARGV[3] '1' when the holder heard the ask (it is dropped).
-- Returns 1 when released (or already gone and never superseded), 0 when superseded.
local lease_key, fence_key = KEYS[1], KEYS[2]
local holder, fence = ARGV[1], tonumber(ARGV[2])

local current = redis.call('HMGET', lease_key, 'holder', 'fence')
if current[1] == holder and tonumber(current[2]) == fence then
    if ARGV[3] ~= '1' and redis.call('HEXISTS', lease_key, 'cancel_by') == 1 then
        redis.call('HDEL', lease_key, 'holder', 'tenant', 'fence', 'expires_at')
    else
        redis.call('DEL', lease_key)
    end
    return 1
end
if not current[1] and tonumber(redis.call('GET', fence_key) or '0') == fence then
    return 1
end
return 0
