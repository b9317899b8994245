-- The outbox row of a transition is written by the database itself, in the
-- same transaction: no transition can exist without its event, whatever
-- code path inserts it, and the event costs no extra round trip.
CREATE FUNCTION gavel_transition_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, from_status, to_status,
                        cause, actor, reason, correlation_id, created_at)
    SELECT NEW.item_id || ':' || NEW.version, i.id, NEW.version, i.client, i.kind, i.external_id, NEW.from_status,
           NEW.to_status, NEW.cause, NEW.actor, NEW.reason, NEW.correlation_id, NEW.created_at
    FROM items i WHERE i.id = NEW.item_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'transition of unknown item %', NEW.item_id;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER transitions_outbox AFTER INSERT ON transitions
    FOR EACH ROW EXECUTE FUNCTION gavel_transition_outbox();
