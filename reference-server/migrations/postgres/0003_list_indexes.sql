-- Indexes for the paginated lists (GET /v1/transfers, /v1/payments): each list is ordered by
-- (created_at, id) within one owner, and each filter is an equality on one more column, so
-- every page is one range scan of an index that starts with (owner, filter), then the order.
-- A team that adds a filter adds its index here too: an unindexed filter scans every row the
-- caller owns, on every page.
-- On a large PostgreSQL table, build them with CREATE INDEX CONCURRENTLY instead, in a migration
-- of its own marked `-- no-transaction` (sqlx otherwise runs a migration in one transaction,
-- where CONCURRENTLY is refused), so writes are not blocked while they build.
DROP INDEX transfers_owner;
CREATE INDEX transfers_owner_page ON transfers (owner, created_at, id);
CREATE INDEX transfers_owner_memo ON transfers (owner, memo, created_at, id);

DROP INDEX payments_owner;
CREATE INDEX payments_owner_page ON payments (owner, created_at, id);
CREATE INDEX payments_owner_key ON payments (owner, idempotency_key, created_at, id);
CREATE INDEX payments_owner_description ON payments (owner, description, created_at, id);

-- receipts_owner (owner, job_id) from 0002 already serves GET /v1/receipts.
