-- Bookkeeping shared by every projection: which build of each projection is live, and how far
-- each projector has folded each partition. Per-build tables come from <projection>.build.sql.
CREATE TABLE onward_projection_builds (
    projection text NOT NULL,
    build integer NOT NULL,
    version integer NOT NULL,
    status text NOT NULL CHECK (status IN ('building', 'active', 'retired')),
    created_at timestamptz NOT NULL DEFAULT now(),
    switched_at timestamptz,
    PRIMARY KEY (projection, build)
);
CREATE UNIQUE INDEX onward_projection_builds_one_active
    ON onward_projection_builds (projection) WHERE status = 'active';

CREATE TABLE onward_projector_positions (
    consumer text NOT NULL,
    partition integer NOT NULL,
    next_offset bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, partition)
);
