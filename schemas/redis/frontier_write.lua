-- One batch of a frontier projection, applied whole: rows, call rows, quarantine, transcript
-- and the consumer's positions change together, as one transaction would change them.
-- Nothing here can fail once it starts writing: the caller checked every value, and every
-- argument is a string this script only compares, stores or turns into a number.
-- ARGV[1] the key prefix, ARGV[2] the consumer, ARGV[3] the format this code writes,
-- ARGV[4..10] how many rows, call rows, cleared runs, quarantine entries, transcript rows,
-- positions and restarted runs follow, then the restarted runs (the key of each one's call rows,
-- deleted, and of its transcript, whose messages through the seq given are deleted, before
-- anything is written: a collected run whose id began again), then the others in that order
-- (see RedisFrontierStore._arguments).
-- Returns 1, or, writing nothing, {partition, stored} for a partition whose stored position is
-- below the one the caller saw stored ('' when it saw none): Redis lost acknowledged writes
-- (a restart without them), and the positions must not be laid over the rows it forgot.
-- A row's tenant and status are kept beside its summary, and the run is in the index of each
-- (runs-of:<tenant>, runs-by-status:<status>) as its stored summary says, moved when they
-- change; a row written before those fields were kept says them in its summary.
local prefix, consumer, format = ARGV[1], ARGV[2], ARGV[3]
local counts = {}
for n = 4, 10 do
    counts[#counts + 1] = tonumber(ARGV[n])
end
local rows, calls, cleared, held, said, positions, restarted = unpack(counts)
local at = 11 + restarted * 3

local function frontier_key(run_id)
    return prefix .. 'frontier:' .. run_id
end

local function newer(stored, through)
    return (not stored) or tonumber(stored) < tonumber(through)
end

local positions_key = prefix .. 'positions:' .. consumer
local positions_at = at + rows * 7 + calls * 4 + cleared + held * 4 + said * 3
for n = 0, positions - 1 do
    local partition, seen = ARGV[positions_at + 3 * n], ARGV[positions_at + 3 * n + 2]
    if seen ~= '' then
        local stored = redis.call('HGET', positions_key, partition)
        if (not stored) or tonumber(stored) < tonumber(seen) then
            return {partition, stored or ''}
        end
    end
end

for n = 0, restarted - 1 do
    local transcript, through = ARGV[12 + 3 * n], tonumber(ARGV[13 + 3 * n])
    redis.call('DEL', ARGV[11 + 3 * n])
    for _, seq in ipairs(redis.call('HKEYS', transcript)) do
        if tonumber(seq) <= through then
            redis.call('HDEL', transcript, seq)
        end
    end
end

if redis.call('SET', prefix .. 'frontier-format', format, 'NX') then
    -- A new store: every run it will hold is indexed by status as it is written.
    redis.call('SET', prefix .. 'runs-by-status-built', '1')
end

-- Puts run_id in the index named index_of(now), out of that of was when they differ.
local function move(index_of, run_id, was, now)
    if was and was ~= now then
        redis.call('ZREM', index_of(was), run_id)
    end
    redis.call('ZADD', index_of(now), 0, run_id)
end

local function tenant_index(tenant)
    return prefix .. 'runs-of:' .. tenant
end

local function status_index(status)
    return prefix .. 'runs-by-status:' .. status
end

-- The tenant and status of a row written before they were kept beside its summary.
local function said_in_summary(key)
    local ok, summary = pcall(cjson.decode, redis.call('HGET', key, 'summary') or '')
    if ok and type(summary) == 'table' then
        local tenant, status = summary['tenant'], summary['status']
        tenant = type(tenant) == 'string' and tenant or nil
        status = type(status) == 'string' and status or nil
        return tenant, status
    end
    return nil, nil
end

for _ = 1, rows do
    local run_id, tenant, status, through = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
    local summary, payload, refused = ARGV[at + 4], ARGV[at + 5], ARGV[at + 6]
    at = at + 7
    local key = frontier_key(run_id)
    local row = redis.call('HMGET', key, 'through', 'tenant', 'status')
    local stored, was_tenant, was_status = row[1], row[2], row[3]
    if not stored then
        redis.call('ZADD', prefix .. 'runs', 0, run_id)
    elseif not (was_tenant and was_status) then
        was_tenant, was_status = said_in_summary(key)
    end
    if newer(stored, through) then
        move(tenant_index, run_id, was_tenant, tenant)
        move(status_index, run_id, was_status, status)
        redis.call(
            'HSET', key, 'through', through, 'summary', summary, 'tenant', tenant, 'status', status
        )
        if payload == '' then
            redis.call('HDEL', key, 'payload')
        else
            redis.call('HSET', key, 'payload', payload)
        end
        if refused == '' then
            redis.call('HDEL', key, 'error')
        else
            redis.call('HSET', key, 'error', refused)
        end
    end
end

for _ = 1, calls do
    local run_id, call_id, through, row = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
    at = at + 4
    local key = prefix .. 'calls:' .. run_id
    if newer(redis.call('HGET', key, 't:' .. call_id), through) then
        redis.call('HSET', key, 't:' .. call_id, through, 'c:' .. call_id, row)
    end
end

local quarantine = prefix .. 'quarantine:' .. consumer
local cleared_runs = {}
if cleared > 0 then
    for _ = 1, cleared do
        cleared_runs[ARGV[at]] = true
        redis.call('HDEL', frontier_key(ARGV[at]), 'quarantined')
        at = at + 1
    end
    for _, position in ipairs(redis.call('SMEMBERS', quarantine)) do
        local entry_key = quarantine .. ':' .. position
        local entry = redis.call('HMGET', entry_key, 'run_id', 'state')
        if entry[1] and cleared_runs[entry[1]] and entry[2] == 'released' then
            redis.call('HSET', entry_key, 'state', 'cleared')
        end
    end
end

-- An entry already stored is held again only while held, or when this write folded its run
-- again (a release): a projector that folded the record before the release and stores after it
-- leaves the released or cleared entry as it is.
for _ = 1, held do
    local position, run_id, entry, mark = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
    at = at + 4
    local entry_key = quarantine .. ':' .. position
    local state = redis.call('HGET', entry_key, 'state')
    if (not state) or state == 'held' or cleared_runs[run_id] then
        redis.call('SADD', quarantine, position)
        redis.call('HSET', entry_key, 'entry', entry, 'state', 'held')
        if run_id == '' then
            redis.call('HDEL', entry_key, 'run_id')
        else
            redis.call('HSET', entry_key, 'run_id', run_id)
            if redis.call('EXISTS', frontier_key(run_id)) == 1 then
                redis.call('HSET', frontier_key(run_id), 'quarantined', mark)
            end
        end
    end
end

for _ = 1, said do
    redis.call('HSETNX', ARGV[at], ARGV[at + 1], ARGV[at + 2])
    at = at + 3
end

for _ = 1, positions do
    local partition, offset = ARGV[at], ARGV[at + 1]
    at = at + 3
    if newer(redis.call('HGET', positions_key, partition), offset) then
        redis.call('HSET', positions_key, partition, offset)
    end
end
return 1
