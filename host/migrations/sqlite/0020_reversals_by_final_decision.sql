-- An automated action (an applied, enforced flag, hold or reject) is
-- overturned exactly while its item's latest moderator decision overturns
-- its verdict: visible overturns flag, hold and reject; held_for_review
-- overturns reject; rejected and deleted confirm all three
-- (host/src/domain/status.rs, `ItemStatus::overturned_verdicts`). Earlier
-- versions marked the decisions behind the item's status at each moderator
-- decision and never cleared a mark, so the marks depended on the path the
-- moderators took: recompute them from the latest moderator transition,
-- and queue the authors of those items for recomputation (recheck_at 0:
-- due at once). Keep in step with ../postgres/0020_reversals_by_final_decision.sql.
UPDATE decisions SET reversed_at = CASE
    WHEN (
        SELECT t.to_status FROM transitions t
        WHERE t.item_id = decisions.item_id AND t.actor = 'moderator'
        ORDER BY t.version DESC LIMIT 1
    ) = 'visible'
    OR ((
        SELECT t.to_status FROM transitions t
        WHERE t.item_id = decisions.item_id AND t.actor = 'moderator'
        ORDER BY t.version DESC LIMIT 1
    ) = 'held_for_review' AND verdict = 'reject')
    THEN COALESCE(reversed_at, (
        SELECT t.created_at FROM transitions t
        WHERE t.item_id = decisions.item_id AND t.actor = 'moderator'
        ORDER BY t.version DESC LIMIT 1
    ))
    ELSE NULL
END
WHERE item_id IN (SELECT item_id FROM transitions WHERE actor = 'moderator')
    AND applied AND mode = 'enforce' AND outcome = 'ok' AND verdict IN ('flag', 'hold', 'reject');

UPDATE authors SET recheck_at = 0
WHERE EXISTS (
    SELECT 1 FROM items i JOIN transitions t ON t.item_id = i.id
    WHERE i.client = authors.client AND i.author = authors.author AND t.actor = 'moderator'
);
