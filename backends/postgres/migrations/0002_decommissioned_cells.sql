-- 0002_decommissioned_cells: cells an administrator decommissioned. The first real step of
-- ClaimStore::decommission_step inserts the row (decommissioned_at = the store clock) in the same
-- transaction as its first deletes; BeginUpdate of a listed cell is refused (CELL_DECOMMISSIONED).
-- The cell's claims are then deleted in bounded steps through claims_by_cell_table_record.

CREATE TABLE decommissioned_cells (
    cell_id           text        COLLATE "C" NOT NULL,
    decommissioned_at timestamptz NOT NULL,
    CONSTRAINT decommissioned_cells_pkey PRIMARY KEY (cell_id)
);
