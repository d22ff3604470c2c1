-- Cells an administrator decommissioned (ClaimStore::decommission_step's first real step writes
-- the row, in the same transaction as its first deletes). BeginUpdate of a listed cell is refused.
-- decommissioned_at: the store clock, INTEGER unix microseconds like every timestamp here.
CREATE TABLE decommissioned_cells (
    cell_id           TEXT    NOT NULL PRIMARY KEY,
    decommissioned_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
