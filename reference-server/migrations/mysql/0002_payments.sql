-- The multi-step example (POST /v1/payments): payments charged at an external processor,
-- and the receipts the enqueuer delivered (its staged_jobs table ships with axum-idempotency).
CREATE TABLE payments (
    id              VARCHAR(255) PRIMARY KEY,
    owner           VARCHAR(255) NOT NULL,
    -- Visible ASCII; quoted and escaped a key's header can be twice its 255 characters.
    idempotency_key VARCHAR(600) CHARACTER SET ascii NOT NULL,
    amount          BIGINT       NOT NULL CHECK (amount > 0),
    currency        VARCHAR(16)  NOT NULL,
    source          TEXT,
    description     VARCHAR(255),
    -- 'pending' (created, not charged) -> 'charged' -> 'succeeded', or 'declined'.
    status          VARCHAR(16)  NOT NULL,
    -- The processor's own Idempotency-Key, recorded before the first call (the intent).
    outbound_key    TEXT         NOT NULL,
    -- Calls made to the processor for this payment (intents recorded), for forensics.
    charge_attempts BIGINT       NOT NULL DEFAULT 0,
    charge_id       TEXT,
    failure_code    TEXT,
    -- Fencing generation of the worker that last wrote this row.
    generation      BIGINT       NOT NULL,
    created_at      BIGINT       NOT NULL,
    updated_at      BIGINT       NOT NULL
) ENGINE = InnoDB;

-- Where the enqueuer delivers receipt jobs (the observable "queue"). Keyed by the staged
-- job's id, so an at-least-once redelivery of the same job is absorbed.
CREATE TABLE receipts (
    job_id      BIGINT       PRIMARY KEY,
    payment_id  VARCHAR(255) NOT NULL,
    owner       VARCHAR(255) NOT NULL,
    amount      BIGINT       NOT NULL,
    currency    VARCHAR(16)  NOT NULL,
    enqueued_at BIGINT       NOT NULL,
    INDEX receipts_owner (owner, job_id)
) ENGINE = InnoDB;
