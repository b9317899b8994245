-- Author standing (docs/ARCHITECTURE.md, "Author standing"). Keep in step
-- with ../sqlite/0011_standing.sql, which explains the columns.
ALTER TABLE authors ADD COLUMN status TEXT NOT NULL DEFAULT 'good';
ALTER TABLE authors ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE authors ADD COLUMN decided_by TEXT CHECK (decided_by IN ('rules', 'moderator'));
ALTER TABLE authors ADD COLUMN strikes DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE authors ADD COLUMN recheck_at BIGINT;
ALTER TABLE authors ADD COLUMN updated_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX authors_recheck ON authors (recheck_at) WHERE recheck_at IS NOT NULL;

-- Strikes are read per author over the decisions of their items.
CREATE INDEX decisions_item_created ON decisions (item_id, created_at);

CREATE TABLE author_transitions (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    client         TEXT NOT NULL,
    author         TEXT NOT NULL,
    from_status    TEXT NOT NULL,
    to_status      TEXT NOT NULL,
    version        BIGINT NOT NULL,
    cause          TEXT NOT NULL CHECK (cause IN ('strikes', 'moderation')),
    actor          TEXT NOT NULL CHECK (actor IN ('rules', 'moderator')),
    actor_name     TEXT,
    reason         TEXT NOT NULL,
    strikes        DOUBLE PRECISION NOT NULL,
    correlation_id TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    -- One transition per author version: two commits can never both produce version N.
    UNIQUE (client, author, version),
    FOREIGN KEY (client, author) REFERENCES authors (client, author)
);

-- The outbox carries author events too (kind = 'author'): `item_id` becomes
-- the event's subject (the item id, or CLIENT:AUTHOR for an author), with no
-- reference to items, and `author` names the author of an author event.
ALTER TABLE outbox DROP CONSTRAINT outbox_item_id_fkey;
ALTER TABLE outbox ADD COLUMN author TEXT;

CREATE FUNCTION gavel_author_transition_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, from_status, to_status,
                        cause, actor, reason, correlation_id, created_at, author)
    VALUES (NEW.client || ':' || NEW.author || ':' || NEW.version, NEW.client || ':' || NEW.author, NEW.version,
            NEW.client, 'author', NULL, NEW.from_status, NEW.to_status, NEW.cause, NEW.actor, NEW.reason,
            NEW.correlation_id, NEW.created_at, NEW.author);
    RETURN NULL;
END
$$;
CREATE TRIGGER author_transitions_outbox AFTER INSERT ON author_transitions
    FOR EACH ROW EXECUTE FUNCTION gavel_author_transition_outbox();
