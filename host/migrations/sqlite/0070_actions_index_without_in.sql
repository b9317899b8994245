-- The partial index of a version's actions named its verdicts with `IN`.
-- SQLite evaluates an index's `WHERE` on every row inserted, and an `IN`
-- list through a temporary table opened and freed each time: every
-- decision stored paid for one, acting or not. The same condition written
-- with `OR` is compared in place. A query uses a partial index only when
-- its own `WHERE` repeats the index's terms, so the queries over it say
-- `verdict = 'flag' OR …` too (`store::plugins::ACTING_VERDICTS`).
-- PostgreSQL checks either form cheaply and proves one from the other; its
-- index stays.
DROP INDEX decisions_actions;
CREATE INDEX decisions_actions ON decisions (plugin_ref, created_at, reversed_at)
    WHERE applied AND (verdict = 'flag' OR verdict = 'hold' OR verdict = 'reject');
