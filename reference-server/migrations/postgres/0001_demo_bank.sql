-- The example endpoint's own tables: accounts owned by callers, and transfers between them.
CREATE TABLE accounts (
    id         TEXT   PRIMARY KEY,
    owner      TEXT   NOT NULL,
    name       TEXT   NOT NULL,
    -- Minor units (cents). The CHECK is the last line of defence; the endpoint checks first.
    balance    BIGINT NOT NULL CHECK (balance >= 0)
);

CREATE INDEX accounts_owner ON accounts (owner);

CREATE TABLE transfers (
    id              TEXT   PRIMARY KEY,
    owner           TEXT   NOT NULL,
    from_account    TEXT   NOT NULL REFERENCES accounts (id),
    to_account      TEXT   NOT NULL REFERENCES accounts (id),
    amount          BIGINT NOT NULL CHECK (amount > 0),
    memo            TEXT,
    created_at      BIGINT NOT NULL,
    -- Kept for forensics: which key produced this transfer.
    idempotency_key TEXT
);

CREATE INDEX transfers_owner ON transfers (owner, created_at);
