-- One build of the frontiers projection: one frontier row per run, one tool_calls row per call.
-- {build} is replaced by the build number; the views onward_frontiers and onward_tool_calls
-- point at the active build.
CREATE TABLE onward_frontiers_{build} (
    run_id text PRIMARY KEY,
    tenant text NOT NULL,
    agent text NOT NULL,
    revision text NOT NULL,
    status text NOT NULL,
    holder text,
    iteration integer NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    last_seq bigint NOT NULL,
    fence bigint NOT NULL,
    last_boundary text,
    resume_seq bigint NOT NULL,
    waiting_on text,
    refused integer NOT NULL,
    partition integer NOT NULL,
    through_offset bigint NOT NULL,
    updated_at bigint NOT NULL,
    payload bytea,
    snapshot_error text,
    quarantined text,
    user_id text
) WITH (fillfactor = 70);
CREATE INDEX onward_frontiers_{build}_by_tenant_status ON onward_frontiers_{build} (tenant, status);
CREATE INDEX onward_frontiers_{build}_by_user_status ON onward_frontiers_{build} (user_id, status)
    WHERE user_id IS NOT NULL;
CREATE INDEX onward_frontiers_{build}_by_status_run ON onward_frontiers_{build} (status, run_id);

CREATE TABLE onward_tool_calls_{build} (
    run_id text NOT NULL,
    call_id text NOT NULL,
    tenant text NOT NULL,
    tool text NOT NULL,
    idempotency_key text NOT NULL,
    fence bigint,
    dispatched_at bigint,
    completed_at bigint,
    outcome text,
    latency_us bigint,
    through_offset bigint NOT NULL,
    PRIMARY KEY (run_id, call_id)
) WITH (fillfactor = 80);
