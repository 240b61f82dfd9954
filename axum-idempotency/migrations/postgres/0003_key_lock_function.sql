-- The claim's in-flight lock as a function: a first execution's BEGIN message calls it,
-- and PL/pgSQL compiles a function once per connection, where the DO block this replaces
-- was compiled afresh on every request. Caller and key arrive hex-encoded (the message is
-- simple-protocol, without bound parameters), so nothing a caller sends is SQL syntax.
-- The lock id is the expression every version of the library uses, so processes of the
-- versions before and after this migration exclude each other during a rolling deploy.
CREATE OR REPLACE FUNCTION axum_idempotency_try_key_lock(caller_hex TEXT, key_hex TEXT)
RETURNS void LANGUAGE plpgsql AS $idem$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(
        current_schema() || chr(31) || convert_from(decode(caller_hex, 'hex'), 'UTF8')
        || chr(31) || convert_from(decode(key_hex, 'hex'), 'UTF8'), 0)) THEN
        RAISE EXCEPTION 'idempotency key in flight' USING ERRCODE = 'IK409';
    END IF;
END
$idem$;
