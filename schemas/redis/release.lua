-- Hand a lease back. The fence counter is left alone, so the next acquisition still raises it.
-- KEYS[1] the lease hash, KEYS[2] the run's fence counter.
-- ARGV[1] holder, ARGV[2] fence.
-- Returns 1 when released (or already gone and never superseded), 0 when superseded.
local lease_key, fence_key = KEYS[1], KEYS[2]
local holder, fence = ARGV[1], tonumber(ARGV[2])

local current = redis.call('HMGET', lease_key, 'holder', 'fence')
if current[1] == holder and tonumber(current[2]) == fence then
    redis.call('DEL', lease_key)
    return 1
end
if not current[1] and tonumber(redis.call('GET', fence_key) or '0') == fence then
    return 1
end
return 0
