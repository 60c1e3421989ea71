-- A row the sealer rejects stays in the chain as a rejection (libs/journal_rejected.sql).
{include:journal_rejected}
