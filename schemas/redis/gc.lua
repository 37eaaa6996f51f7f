-- Count or delete the keys one finished run left: its lease hash and fence counter (unless a
-- holder has the lease now, by this server's clock) and its MCP schema cache entry.
-- KEYS[1] the lease hash, KEYS[2] the fence counter, KEYS[3] the schema cache entry.
-- ARGV[1] '1' to delete, '0' to count.
-- Returns {lease, fence, schema}: 1 for each key that was there (and is now deleted).
local lease_key, fence_key, schema_key = KEYS[1], KEYS[2], KEYS[3]
local delete = ARGV[1] == '1'

local found = {0, 0, redis.call('EXISTS', schema_key)}
local expires_at = redis.call('HGET', lease_key, 'expires_at')
if not (expires_at and tonumber(expires_at) > server_now()) then
    found[1] = redis.call('EXISTS', lease_key)
    found[2] = redis.call('EXISTS', fence_key)
    if delete then
        redis.call('DEL', lease_key, fence_key)
    end
end
if delete then
    redis.call('DEL', schema_key)
end
return found
