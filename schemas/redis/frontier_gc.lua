-- Count or delete the keys one finished run left in the frontier store, checking first, in
-- the same atomic step, that its stored summary says it finished (before the cutoff, when one
-- is given: a run whose row an event touched since the sweep decided is not old now) and its
-- row is not set aside in quarantine (a row that stops short of a record that could not be
-- read).
-- KEYS[1] the frontier hash, KEYS[2] the call rows, KEYS[3] the transcript hash,
-- KEYS[4] the index of every run, KEYS[5] the index of the run's tenant, KEYS[6..] the indexes
-- of the statuses of a finished run, in the order of ARGV[5..].
-- ARGV[1] the run id, ARGV[2] '1' to delete, '0' to count, ARGV[3] 'expired' (every key) or
-- 'calls' (the call rows alone), ARGV[4] the cutoff its row must be last touched before
-- (microseconds; '' for none), ARGV[5..] the statuses of a finished run.
-- Returns {frontiers, transcript rows, call rows, swept}: what there was (and is now deleted),
-- and 1 if the run was one to sweep, 0 if it keeps everything.
local frontier_key, calls_key, transcript_key = KEYS[1], KEYS[2], KEYS[3]
local runs_key, tenant_runs_key = KEYS[4], KEYS[5]
local run_id, delete, scope, before = ARGV[1], ARGV[2] == '1', ARGV[3], tonumber(ARGV[4])

local summary = redis.call('HGET', frontier_key, 'summary')
if not summary or redis.call('HEXISTS', frontier_key, 'quarantined') == 1 then
    return {0, 0, 0, 0}
end
summary = cjson.decode(summary)
local status = summary['status']
local updated_at = tonumber(summary['updated_at'])
if before and not (updated_at and updated_at < before) then
    return {0, 0, 0, 0}
end
local status_index = nil
for n = 5, #ARGV do
    if ARGV[n] == status then
        status_index = KEYS[n + 1]
    end
end
if not status_index then
    return {0, 0, 0, 0}
end

-- Every call row is two fields: 'c:<call>' (the row) and 't:<call>' (its offset).
local calls = math.floor(redis.call('HLEN', calls_key) / 2)
if scope == 'calls' then
    if delete then
        redis.call('DEL', calls_key)
    end
    return {0, 0, calls, 1}
end
local said = redis.call('HLEN', transcript_key)
if delete then
    redis.call('DEL', frontier_key, calls_key, transcript_key)
    redis.call('ZREM', runs_key, run_id)
    redis.call('ZREM', tenant_runs_key, run_id)
    redis.call('ZREM', status_index, run_id)
end
return {1, said, calls, 1}
