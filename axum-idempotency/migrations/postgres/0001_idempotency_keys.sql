-- One row per (caller, key): the key's state machine, its lease and its stored response.
-- Times are BIGINT milliseconds since the Unix epoch, read from the server's clock
-- abstraction (never from now()), so tests can move time and both backends share one SQL text.
CREATE TABLE idempotency_keys (
    caller               TEXT    NOT NULL,
    idem_key             TEXT    NOT NULL,
    fingerprint          TEXT    NOT NULL,
    -- 'in_flight' or 'complete' (absent = no row, or a row past its replay window).
    state                TEXT    NOT NULL CHECK (state IN ('in_flight', 'complete')),
    -- Multi-step requests: the last committed phase ('started' ... 'finished').
    recovery_point       TEXT    NOT NULL DEFAULT 'started',
    -- Fencing generation: bumped on every (re)claim; a commit carrying an older one is refused.
    generation           BIGINT  NOT NULL DEFAULT 1,
    locked_at            BIGINT,
    lease_expires_at     BIGINT,
    created_at           BIGINT  NOT NULL,
    replay_until         BIGINT  NOT NULL,
    expires_at           BIGINT  NOT NULL,
    completed_at         BIGINT,
    -- The request, kept so a completer can finish an abandoned multi-step request.
    request_method       TEXT    NOT NULL,
    request_path         TEXT    NOT NULL,
    request_content_type TEXT,
    request_body         BYTEA,
    -- The stored final response (2xx/4xx only).
    response_status      BIGINT,
    response_headers     TEXT,
    response_body        BYTEA,
    PRIMARY KEY (caller, idem_key)
);

CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
CREATE INDEX idempotency_keys_in_flight ON idempotency_keys (lease_expires_at) WHERE state = 'in_flight';
