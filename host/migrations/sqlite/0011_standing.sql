-- Author standing (docs/ARCHITECTURE.md, "Author standing"). Keep in step
-- with ../postgres/0011_standing.sql.
--
-- The account state lives on the author's row and changes only by a
-- conditional write fenced by `version`, with its audit row in
-- `author_transitions` (and that row's outbox event, by trigger) in the same
-- transaction. `strikes` is what the last recomputation derived from the
-- decision log: a cache for reads and rule snapshots, never incremented.
-- `recheck_at` says when the author must be recomputed: set to the commit
-- time by every transaction that records a decision that may count or
-- reverses one, and to the next strike expiry by a recomputation; the
-- reconciler queues every author whose time has come.
ALTER TABLE authors ADD COLUMN status TEXT NOT NULL DEFAULT 'good';
ALTER TABLE authors ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE authors ADD COLUMN decided_by TEXT CHECK (decided_by IN ('rules', 'moderator'));
ALTER TABLE authors ADD COLUMN strikes REAL NOT NULL DEFAULT 0;
ALTER TABLE authors ADD COLUMN recheck_at BIGINT;
ALTER TABLE authors ADD COLUMN updated_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX authors_recheck ON authors (recheck_at) WHERE recheck_at IS NOT NULL;

-- Strikes are read per author over the decisions of their items.
CREATE INDEX decisions_item_created ON decisions (item_id, created_at);

CREATE TABLE author_transitions (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    client         TEXT NOT NULL,
    author         TEXT NOT NULL,
    from_status    TEXT NOT NULL,
    to_status      TEXT NOT NULL,
    version        BIGINT NOT NULL,
    cause          TEXT NOT NULL CHECK (cause IN ('strikes', 'moderation')),
    actor          TEXT NOT NULL CHECK (actor IN ('rules', 'moderator')),
    actor_name     TEXT,
    reason         TEXT NOT NULL,
    strikes        REAL NOT NULL,
    correlation_id TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    -- One transition per author version: two commits can never both produce version N.
    UNIQUE (client, author, version),
    FOREIGN KEY (client, author) REFERENCES authors (client, author)
);

-- The outbox carries author events too (kind = 'author'): `item_id` becomes
-- the event's subject (the item id, or CLIENT:AUTHOR for an author), with no
-- reference to items, and `author` names the author of an author event.
-- SQLite cannot drop a constraint, so the table is rebuilt (the migration
-- runs with foreign keys off and they are checked afterwards).
DROP TRIGGER transitions_outbox;
CREATE TABLE outbox_new (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id       TEXT NOT NULL UNIQUE,
    item_id        TEXT NOT NULL,
    item_version   BIGINT NOT NULL,
    client         TEXT NOT NULL,
    kind           TEXT NOT NULL,
    external_id    TEXT,
    from_status    TEXT NOT NULL,
    to_status      TEXT NOT NULL,
    cause          TEXT NOT NULL,
    actor          TEXT NOT NULL,
    reason         TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    txid           BIGINT NOT NULL DEFAULT 0,
    author         TEXT
);
INSERT INTO outbox_new (seq, event_id, item_id, item_version, client, kind, external_id, from_status, to_status,
                        cause, actor, reason, correlation_id, created_at, txid)
SELECT seq, event_id, item_id, item_version, client, kind, external_id, from_status, to_status,
       cause, actor, reason, correlation_id, created_at, txid FROM outbox;
-- The sequence goes on where it was, even past rows retention deleted:
-- webhook cursors and clients' feed cursors point into it.
DELETE FROM sqlite_sequence WHERE name = 'outbox_new';
INSERT INTO sqlite_sequence (name, seq) SELECT 'outbox_new', seq FROM sqlite_sequence WHERE name = 'outbox';
DROP TABLE outbox;
ALTER TABLE outbox_new RENAME TO outbox;
CREATE INDEX outbox_item ON outbox (item_id, item_version);
CREATE INDEX outbox_feed ON outbox (txid, seq);
CREATE INDEX outbox_client_feed ON outbox (client, txid, seq);
CREATE INDEX outbox_created ON outbox (created_at);

CREATE TRIGGER transitions_outbox AFTER INSERT ON transitions
BEGIN
    INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, from_status, to_status,
                        cause, actor, reason, correlation_id, created_at)
    SELECT NEW.item_id || ':' || NEW.version, id, NEW.version, client, kind, external_id, NEW.from_status,
           NEW.to_status, NEW.cause, NEW.actor, NEW.reason, NEW.correlation_id, NEW.created_at
    FROM items WHERE id = NEW.item_id;
END;

CREATE TRIGGER author_transitions_outbox AFTER INSERT ON author_transitions
BEGIN
    INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, from_status, to_status,
                        cause, actor, reason, correlation_id, created_at, author)
    VALUES (NEW.client || ':' || NEW.author || ':' || NEW.version, NEW.client || ':' || NEW.author, NEW.version,
            NEW.client, 'author', NULL, NEW.from_status, NEW.to_status, NEW.cause, NEW.actor, NEW.reason,
            NEW.correlation_id, NEW.created_at, NEW.author);
END;
