-- The proposal a command was admitted from: `proposal_row` joins commands on it (every
-- approval and every refused or asked proposal reads it), and removing a proposal checks its
-- foreign key through it. Without this index both scan every command.
CREATE INDEX commands_by_proposal ON admission.commands (tenant, proposal_id);
