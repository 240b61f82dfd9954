-- Indexes for the paginated lists (GET /v1/transfers, /v1/payments), as on PostgreSQL: each
-- list is ordered by (created_at, id) within one owner, and each filter is an equality on
-- one more column. (MySQL built none of the owner-only indexes PostgreSQL's 0001/0002 did,
-- so there is nothing to drop.)
CREATE INDEX transfers_owner_page ON transfers (owner, created_at, id);
CREATE INDEX transfers_owner_memo ON transfers (owner, memo, created_at, id);
CREATE INDEX payments_owner_page ON payments (owner, created_at, id);
CREATE INDEX payments_owner_key ON payments (owner, idempotency_key, created_at, id);
CREATE INDEX payments_owner_description ON payments (owner, description, created_at, id);
