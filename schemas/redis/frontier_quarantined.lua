-- One bounded step of listing a consumer's quarantine entries: of the next positions SSCAN
-- gives from the cursor, those whose entry is in one of the states asked for, and of the run
-- named, if one is. A listing then brings over the entries it asked for alone, not every entry
-- the quarantine ever held (each projector looks for released runs every second), and no step
-- holds Redis longer than a chunk of entries takes.
-- ARGV[1] the key prefix, ARGV[2] the consumer, ARGV[3] the cursor ('0' to start), ARGV[4]
-- how many positions a step looks at, about, ARGV[5] the run ('' for every run), ARGV[6] '1'
-- for entries in any state, else ARGV[7..] the states.
-- Returns {the next cursor ('0' once done), positions '<partition>:<offset>'...}; a position
-- may come again in a later step, as SSCAN may give it twice.
local prefix, consumer, cursor, chunk = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local run_id, any_state = ARGV[5], ARGV[6] == '1'
local quarantine = prefix .. 'quarantine:' .. consumer
local wanted = {}
for n = 7, #ARGV do
    wanted[ARGV[n]] = true
end
local scanned = redis.call('SSCAN', quarantine, cursor, 'COUNT', chunk)
local found = {scanned[1]}
for _, position in ipairs(scanned[2]) do
    local entry = redis.call('HMGET', quarantine .. ':' .. position, 'run_id', 'state')
    if entry[2] and (any_state or wanted[entry[2]]) and (run_id == '' or entry[1] == run_id) then
        found[#found + 1] = position
    end
end
return found
