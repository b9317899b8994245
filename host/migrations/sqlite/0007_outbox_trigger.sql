-- The outbox row of a transition is written by the database itself, in the
-- same statement's transaction: no transition can exist without its event,
-- whatever code path inserts it, and the event costs no extra round trip.
CREATE TRIGGER transitions_outbox AFTER INSERT ON transitions
BEGIN
    INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, from_status, to_status,
                        cause, actor, reason, correlation_id, created_at)
    SELECT NEW.item_id || ':' || NEW.version, id, NEW.version, client, kind, external_id, NEW.from_status,
           NEW.to_status, NEW.cause, NEW.actor, NEW.reason, NEW.correlation_id, NEW.created_at
    FROM items WHERE id = NEW.item_id;
END;
