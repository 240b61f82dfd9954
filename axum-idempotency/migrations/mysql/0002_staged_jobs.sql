-- Jobs staged in the same transaction as the business writes that need them; the
-- enqueuer reads only committed rows, so a job never escapes a rolled-back transaction.
CREATE TABLE IF NOT EXISTS staged_jobs (
    id         BIGINT   NOT NULL AUTO_INCREMENT PRIMARY KEY,
    kind       TEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload    LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    created_at BIGINT   NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
