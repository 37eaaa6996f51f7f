-- What the lease scripts share; RedisLeaseStore puts it before each of them.

-- Seconds since the epoch by this server's clock (TIME), never a time a caller sent.
local function server_now()
    local time = redis.call('TIME')
    return tonumber(time[1]) + tonumber(time[2]) / 1000000
end

-- The expires_at of the lease in lease_key when it is holder's, under fence, and unexpired at
-- now; otherwise nil and the reason the holder lost it.
local function held_until(lease_key, holder, fence, now)
    local current = redis.call('HMGET', lease_key, 'holder', 'fence', 'expires_at')
    if not current[1] then
        return nil, 'released or expired'
    end
    if current[1] ~= holder or tonumber(current[2]) ~= fence then
        return nil, 'superseded by fence ' .. current[2] .. ' of ' .. current[1]
    end
    if not (tonumber(current[3]) > now) then
        return nil, 'expired'
    end
    return current[3]
end
