-- One row per Idempotency-Key the processor has accepted. The UNIQUE key is
-- what makes the claim atomic: INSERT ... ON CONFLICT DO NOTHING lets exactly
-- one of several concurrent requests create the charge.
CREATE TABLE charges (
    id              TEXT PRIMARY KEY NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    fingerprint     TEXT NOT NULL,
    amount          INTEGER NOT NULL CHECK (amount > 0),
    currency        TEXT NOT NULL,
    source          TEXT,
    description     TEXT,
    status          TEXT NOT NULL CHECK (status IN ('succeeded', 'declined')),
    failure_code    TEXT,
    created_at      TEXT NOT NULL
);

-- Calls received per key, including replays, declines and 503s: the numbers
-- crash-recovery tests assert on ("zero repeated calls", "at most one").
CREATE TABLE key_calls (
    idempotency_key TEXT PRIMARY KEY NOT NULL,
    calls           INTEGER NOT NULL
);
