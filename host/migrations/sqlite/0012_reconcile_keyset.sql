-- The reconciler pages through every pending item and every author due in
-- (time, key) order (host/src/worker.rs, `Worker::reconcile`); holding the
-- key in the index makes each page one index range, however long the
-- backlog. Keep in step with ../postgres/0012_reconcile_keyset.sql.
DROP INDEX items_needs_eval;
CREATE INDEX items_needs_eval ON items (needs_eval_since, id) WHERE needs_eval_since IS NOT NULL;
DROP INDEX authors_recheck;
CREATE INDEX authors_recheck ON authors (recheck_at, client, author) WHERE recheck_at IS NOT NULL;
