-- Hand back a lease on a run that does not exist, with the run's fence counter, when the lease
-- is this holder's and holds the run's first fence: that fence was never written to the log.
-- KEYS[1] the lease hash, KEYS[2] the run's fence counter.
-- ARGV[1] holder, ARGV[2] fence.
-- Returns 1 when both keys were deleted, 0 when nothing was (the caller then releases).
local lease_key, fence_key = KEYS[1], KEYS[2]
local holder, fence = ARGV[1], tonumber(ARGV[2])

local current = redis.call('HMGET', lease_key, 'holder', 'fence')
if fence == 1 and current[1] == holder and tonumber(current[2]) == 1
    and tonumber(redis.call('GET', fence_key) or '0') == 1 then
    redis.call('DEL', lease_key, fence_key)
    return 1
end
return 0
