-- The multi-step example (POST /v1/payments): payments charged at an external processor,
-- and the receipts the enqueuer delivered (its staged_jobs table ships with axum-idempotency).
CREATE TABLE payments (
    id              TEXT    PRIMARY KEY,
    owner           TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    amount          BIGINT  NOT NULL CHECK (amount > 0),
    currency        TEXT    NOT NULL,
    source          TEXT,
    description     TEXT,
    -- 'pending' (created, not charged) -> 'charged' -> 'succeeded', or 'declined'.
    status          TEXT    NOT NULL,
    -- The processor's own Idempotency-Key, recorded before the first call (the intent).
    outbound_key    TEXT    NOT NULL,
    -- Calls made to the processor for this payment (intents recorded), for forensics.
    charge_attempts BIGINT  NOT NULL DEFAULT 0,
    charge_id       TEXT,
    failure_code    TEXT,
    -- Fencing generation of the worker that last wrote this row.
    generation      BIGINT  NOT NULL,
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL
);

CREATE INDEX payments_owner ON payments (owner, created_at);

-- Where the enqueuer delivers receipt jobs (the observable "queue"). Keyed by the staged
-- job's id, so an at-least-once redelivery of the same job is absorbed.
CREATE TABLE receipts (
    job_id      BIGINT  PRIMARY KEY,
    payment_id  TEXT    NOT NULL,
    owner       TEXT    NOT NULL,
    amount      BIGINT  NOT NULL,
    currency    TEXT    NOT NULL,
    enqueued_at BIGINT  NOT NULL
);

CREATE INDEX receipts_owner ON receipts (owner, job_id);
