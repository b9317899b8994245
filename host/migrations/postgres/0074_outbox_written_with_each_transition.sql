-- A transition's outbox event was written by a row trigger on `transitions`
-- (0007): a PL/pgSQL call and a statement of its own per transition, about
-- a sixth of PostgreSQL's time under load with the foreign-key checks. Every
-- transition is inserted by one store function (`store/bulk.rs`,
-- `BulkInsert::insert_transitions`), which now inserts the batch's audit
-- rows and their outbox events in one statement: the outbox rows are made
-- from the rows the audit insert returns, in its order, so neither can
-- commit without the other. Account transitions keep their trigger (0011):
-- they are few.
DROP TRIGGER transitions_outbox ON transitions;
DROP FUNCTION gavel_transition_outbox();
