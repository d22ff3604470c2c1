-- The fleet-wide verification slots (serve --max-concurrent-verifications): one row per verifier
-- holding a slot, keyed by its cell and holder id. expires_at: the store clock, INTEGER unix
-- microseconds like every timestamp here; a row past it is a free slot (deleted by the next
-- acquire). Acquires run in BEGIN IMMEDIATE, so they are serialized with each other.
CREATE TABLE verification_slots (
    cell_id    TEXT    NOT NULL,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (cell_id, holder)
) STRICT, WITHOUT ROWID;
