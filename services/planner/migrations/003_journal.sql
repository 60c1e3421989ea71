-- The audit journal (libs/journal.sql). The planner writes a row in the same transaction as every
-- run it starts (with the evidence the model saw), every step (each captured model response and
-- tool output) and every status change; `writ audit replay` walks a run from these rows.
{include:journal}
