-- 0004_restore_epochs: the restore epochs (domain::restore, decision 100). One row per
-- `admin mark-restored`, numbered 1, 2, …; every earlier epoch stays as history, and the store's
-- state is the row with the highest epoch and its reports. marked_at, reported_at and lifted_at
-- are the store clock (backup_time is the operator's word). expected_cells: the cells whose
-- verification passes lift the quarantine, joined with E'\n' (a cell id never contains one; the
-- empty string is no cell). lifted_at/lift_reason: NULL while quarantined, both set at the lift.
-- Marks, reports and lifts serialize on the advisory lock (RESTORE_LOCK_CLASS,
-- hashtext(current_schema())) before they read the tables (see restore.rs, "why a restore lock");
-- the primary keys are the second line of defence.

CREATE TABLE restore_epochs (
    epoch          bigint      NOT NULL,
    backup_time    timestamptz NOT NULL,
    marked_at      timestamptz NOT NULL,
    reason         text        NOT NULL,
    expected_cells text        COLLATE "C" NOT NULL,
    lifted_at      timestamptz,
    lift_reason    text,
    CONSTRAINT restore_epochs_pkey PRIMARY KEY (epoch),
    CONSTRAINT restore_epochs_lift_complete CHECK ((lifted_at IS NULL) = (lift_reason IS NULL))
);

-- The cells that reported a whole verification pass in an epoch, with when (store clock).
CREATE TABLE restore_reports (
    epoch       bigint      NOT NULL REFERENCES restore_epochs (epoch),
    cell_id     text        COLLATE "C" NOT NULL,
    reported_at timestamptz NOT NULL,
    CONSTRAINT restore_reports_pkey PRIMARY KEY (epoch, cell_id)
);
