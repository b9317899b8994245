-- Evaluations that failed in the host (not in a plugin) past their retry
-- budget. At most one open (not replayed) dead letter per item.
CREATE TABLE dead_letters (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    item_id     TEXT NOT NULL REFERENCES items (id),
    attempts    INTEGER NOT NULL,
    last_error  TEXT NOT NULL,
    failed_at   BIGINT NOT NULL,
    replayed_at BIGINT
);
CREATE UNIQUE INDEX dead_letters_open ON dead_letters (item_id) WHERE replayed_at IS NULL;
