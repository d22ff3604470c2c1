-- Restore epochs (domain::restore, decision 100): one row per `admin mark-restored`, numbered
-- 1, 2, … Every earlier epoch stays as history; the store's state is the row with the highest
-- epoch and its reports. Timestamps are INTEGER unix microseconds of the store clock, like every
-- timestamp here (backup_time is the operator's word). expected_cells: the cells whose
-- verification passes lift the quarantine, joined with '\n' (a cell id never contains one; the
-- empty string is no cell). lifted_at/lift_reason: NULL while quarantined, both set at the lift.
-- Marks, reports and lifts run in BEGIN IMMEDIATE, so they are serialized with each other.
CREATE TABLE restore_epochs (
    epoch          INTEGER NOT NULL PRIMARY KEY,
    backup_time    INTEGER NOT NULL,
    marked_at      INTEGER NOT NULL,
    reason         TEXT    NOT NULL,
    expected_cells TEXT    NOT NULL,
    lifted_at      INTEGER,
    lift_reason    TEXT,
    CHECK ((lifted_at IS NULL) = (lift_reason IS NULL))
) STRICT;

-- The cells that reported a whole verification pass in an epoch, with when (store clock).
CREATE TABLE restore_reports (
    epoch       INTEGER NOT NULL REFERENCES restore_epochs (epoch),
    cell_id     TEXT    NOT NULL,
    reported_at INTEGER NOT NULL,
    PRIMARY KEY (epoch, cell_id)
) STRICT, WITHOUT ROWID;
