-- Migration 3 creates the PostgreSQL key lock function (see postgres/0003). This store takes
-- no advisory lock, so it has nothing to create; the migration exists so every store keeps
-- the same numbered history.
SELECT 1;
