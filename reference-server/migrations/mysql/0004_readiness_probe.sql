-- One row that GET /readyz writes (an upsert, committed): readiness means the
-- store accepts writes, not only that it answers reads (a full disk, a
-- read-only store).
CREATE TABLE readiness_probe (
    id        BIGINT PRIMARY KEY,
    probed_at BIGINT NOT NULL
) ENGINE = InnoDB;
