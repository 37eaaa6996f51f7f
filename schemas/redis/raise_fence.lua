-- Lift a held lease's fence above a fence the run's log already holds, keeping its expiry.
-- KEYS[1] the lease hash, KEYS[2] the run's fence counter (never expires, only goes up).
-- ARGV[1] holder, ARGV[2] fence, ARGV[3] the fence to go above.
-- Returns {1, fence, expires_at, cancel_by, cancel_why} when raised (the two last as renew.lua's), {0, reason} when the lease is lost. The new fence
-- is max(counter, above) + 1, written to the counter too, so every later acquisition (an INCR
-- of the counter) goes higher still.
local lease_key, fence_key = KEYS[1], KEYS[2]
local holder, fence, above = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local expires_at, why = held_until(lease_key, holder, fence, server_now())
if not expires_at then
    return {0, why}
end

local counter = tonumber(redis.call('GET', fence_key) or '0')
local raised = string.format('%d', math.max(counter, above) + 1)
redis.call('SET', fence_key, raised)
redis.call('HSET', lease_key, 'fence', raised)
local asked = redis.call('HMGET', lease_key, 'cancel_by', 'cancel_why')
return {1, raised, expires_at, asked[1], asked[2]}
