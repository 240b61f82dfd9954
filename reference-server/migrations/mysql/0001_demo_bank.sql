-- The example endpoint's own tables on MySQL / MariaDB (the same shape as
-- migrations/postgres; keys are VARCHAR because MySQL cannot index TEXT whole).
CREATE TABLE accounts (
    id         VARCHAR(255) PRIMARY KEY,
    owner      VARCHAR(255) NOT NULL,
    name       TEXT         NOT NULL,
    -- Minor units (cents). The CHECK is the last line of defence; the endpoint checks first.
    balance    BIGINT       NOT NULL CHECK (balance >= 0),
    INDEX accounts_owner (owner)
) ENGINE = InnoDB;

CREATE TABLE transfers (
    id              VARCHAR(255) PRIMARY KEY,
    owner           VARCHAR(255) NOT NULL,
    from_account    VARCHAR(255) NOT NULL,
    to_account      VARCHAR(255) NOT NULL,
    amount          BIGINT       NOT NULL CHECK (amount > 0),
    -- At most 140 characters (the endpoint checks), so it can be indexed.
    memo            VARCHAR(255),
    created_at      BIGINT       NOT NULL,
    -- Kept for forensics: which key produced this transfer.
    -- The header as sent: quoted and escaped it can be twice the key's 255 characters.
    idempotency_key TEXT,
    FOREIGN KEY (from_account) REFERENCES accounts (id),
    FOREIGN KEY (to_account) REFERENCES accounts (id)
) ENGINE = InnoDB;
