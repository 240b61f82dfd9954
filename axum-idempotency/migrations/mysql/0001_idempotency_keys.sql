-- One row per (caller, key): the key's state machine, its lease and its stored response.
-- Times are BIGINT milliseconds since the Unix epoch, read from the server's clock
-- abstraction (never from NOW()), as on the other stores.
-- MySQL DDL is not transactional (each statement commits), so every statement here is
-- idempotent (IF NOT EXISTS, indexes inside CREATE TABLE): two processes starting at once
-- may both run it (see crate::migrate).
-- Binary collations: a key and a caller compare byte for byte, as on the other stores
-- ('Abc' and 'abc' are two keys). A caller is at most 512 characters on this store.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    caller               VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    idem_key             VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fingerprint          VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- 'in_flight' or 'complete' (absent = no row, or a row past its replay window).
    state                VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- Multi-step requests: the last committed phase ('started' ... 'finished').
    recovery_point       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT 'started',
    -- Fencing generation: bumped on every (re)claim; a commit carrying an older one is refused.
    generation           BIGINT       NOT NULL DEFAULT 1,
    locked_at            BIGINT,
    lease_expires_at     BIGINT,
    created_at           BIGINT       NOT NULL,
    replay_until         BIGINT       NOT NULL,
    expires_at           BIGINT       NOT NULL,
    completed_at         BIGINT,
    -- The request, kept so a completer can finish an abandoned multi-step request.
    request_method       VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    request_path         TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    request_content_type TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    request_body         LONGBLOB,
    -- The stored final response (2xx/4xx only).
    response_status      BIGINT,
    response_headers     LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    response_body        LONGBLOB,
    -- The claim's arbiter: the primary key on (caller, idem_key) (clause idem.claim.atomic).
    PRIMARY KEY (caller, idem_key),
    CONSTRAINT idempotency_keys_state CHECK (state IN ('in_flight', 'complete')),
    INDEX idempotency_keys_expires_at (expires_at),
    -- MySQL has no partial index: (state, lease_expires_at) serves the in-flight scans.
    INDEX idempotency_keys_in_flight (state, lease_expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
