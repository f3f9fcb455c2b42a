-- Issue 16: the outbox relay of a producer is woken by the commit of any transaction that wrote rows for it,
-- in whichever process (another replica, an operator's tool), instead of polling every 50 ms. Each new
-- outbox row notifies the channel `gpusched_outbox` with its producer's name; PostgreSQL delivers
-- notifications only at commit, and once per distinct payload per transaction, so a batch of a thousand
-- rows wakes each relay once. The relay still polls, rarely, in case a notification is missed (a listening
-- connection that broke unnoticed).
CREATE OR REPLACE FUNCTION gpusched_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gpusched_outbox', NEW.producer);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION gpusched_outbox_notify();
