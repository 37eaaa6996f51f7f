-- One step of indexing by status the runs a store held before it kept that index: the next
-- ARGV[2] runs of the index of every run, each put in the indexes of the status and the
-- tenant its row says.
-- Rows written meanwhile are indexed by the write script, so once a pass has reached the last
-- run every run is in the index of its status, and runs-by-status-built says so.
-- ARGV[1] the key prefix, ARGV[2] how many runs a step indexes.
-- Returns 1 once every run is indexed, else 0 (call again).
local prefix, chunk = ARGV[1], tonumber(ARGV[2])
local built, cursor_key = prefix .. 'runs-by-status-built', prefix .. 'runs-by-status-cursor'
if redis.call('EXISTS', built) == 1 then
    return 1
end
local cursor = redis.call('GET', cursor_key)
local start = cursor and ('(' .. cursor) or '-'
local ids = redis.call('ZRANGEBYLEX', prefix .. 'runs', start, '+', 'LIMIT', 0, chunk)
for _, run_id in ipairs(ids) do
    local key = prefix .. 'frontier:' .. run_id
    local row = redis.call('HMGET', key, 'status', 'tenant', 'summary')
    local status, tenant = row[1], row[2]
    if not (status and tenant) and row[3] then
        local ok, summary = pcall(cjson.decode, row[3])
        if ok and type(summary) == 'table' then
            status = type(summary['status']) == 'string' and summary['status'] or nil
            tenant = type(summary['tenant']) == 'string' and summary['tenant'] or nil
        end
    end
    if status then
        redis.call('ZADD', prefix .. 'runs-by-status:' .. status, 0, run_id)
    end
    if tenant then
        -- A run stored before its tenant was known may be missing from that tenant's index.
        redis.call('ZADD', prefix .. 'runs-of:' .. tenant, 0, run_id)
    end
end
if #ids < chunk then
    redis.call('SET', built, '1')
    redis.call('DEL', cursor_key)
    return 1
end
redis.call('SET', cursor_key, ids[#ids])
return 0
