-- A person releases a run: its held quarantine entries become released, and its frontier row
-- says so, together.
-- ARGV[1] the key prefix, ARGV[2] the consumer, ARGV[3] the run, ARGV[4] who, ARGV[5] when
-- (microseconds), ARGV[6] the row's new mark.
-- Returns how many entries it released.
local prefix, consumer, run_id, by, at, mark = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local quarantine = prefix .. 'quarantine:' .. consumer
local released = 0
for _, position in ipairs(redis.call('SMEMBERS', quarantine)) do
    local entry_key = quarantine .. ':' .. position
    local entry = redis.call('HMGET', entry_key, 'run_id', 'state')
    if entry[1] == run_id and entry[2] == 'held' then
        redis.call('HSET', entry_key, 'state', 'released', 'released_by', by, 'released_at', at)
        released = released + 1
    end
end
local row = prefix .. 'frontier:' .. run_id
if released > 0 and redis.call('EXISTS', row) == 1 then
    redis.call('HSET', row, 'quarantined', mark)
end
return released
