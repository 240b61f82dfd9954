-- Jobs staged in the same transaction as the business writes that need them; the
-- enqueuer reads only committed rows, so a job never escapes a rolled-back transaction.
CREATE TABLE staged_jobs (
    id         BIGSERIAL PRIMARY KEY,
    kind       TEXT    NOT NULL,
    payload    TEXT    NOT NULL,
    created_at BIGINT  NOT NULL
);
