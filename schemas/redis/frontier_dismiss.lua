-- A person dismisses a held quarantine entry that names no run (nothing of its record could be
-- read): it becomes cleared, with who and when. One that names a run is left to a release.
-- ARGV[1] the key prefix, ARGV[2] the consumer, ARGV[3] the position '<partition>:<offset>',
-- ARGV[4] who, ARGV[5] when (microseconds).
-- Returns 1 when it dismissed the entry, else 0.
local prefix, consumer, position, by, at = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local quarantine = prefix .. 'quarantine:' .. consumer
if redis.call('SISMEMBER', quarantine, position) == 0 then
    return 0
end
local entry_key = quarantine .. ':' .. position
local entry = redis.call('HMGET', entry_key, 'run_id', 'state')
if entry[1] or entry[2] ~= 'held' then
    return 0
end
redis.call('HSET', entry_key, 'state', 'cleared', 'released_by', by, 'released_at', at)
return 1
