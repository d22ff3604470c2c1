//! A whole store as rows, to move it from one backend to another: a PostgreSQL backup is a
//! SQLite store file (decision 112), written from these rows and read back into them.
//!
//! The rows are in the SQLite store's representation, which is the plainest: integers, text and
//! bytes; times as microseconds since the Unix epoch, lease ids as lowercase text, booleans as
//! 0/1, a claim under no lease with `lease_op` 0. Each backend maps its own column types to and
//! from it. Verification slots are left out: they expire within minutes, and a restored store
//! must not start with slots held by verifiers of another time.

/// One value of a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

/// How a column is kept, for the backends whose column types differ from the rows'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int,
    Text,
    Bytes,
    /// Microseconds since the Unix epoch (PostgreSQL: `timestamptz`).
    Micros,
    /// A lease id, lowercase hyphenated (PostgreSQL: `uuid`).
    Uuid,
    /// 0 or 1 (PostgreSQL: `boolean`).
    Bool,
    /// A claim's lease op, 0 under no lease (PostgreSQL: NULL then).
    LeaseOp,
}

/// A table of the store: its name in each backend and its columns, in the order of
/// [`TableRows::rows`].
#[derive(Clone, Copy, Debug)]
pub struct Table {
    /// The SQLite table.
    pub sqlite: &'static str,
    /// The PostgreSQL table.
    pub postgres: &'static str,
    /// `(column, kind, nullable)`.
    pub columns: &'static [(&'static str, Kind, bool)],
}

/// Every table a transfer moves, parents before children (leases before the claims that name
/// them, epochs before their reports): the order to insert in.
pub const TABLES: [Table; 7] = [
    Table {
        sqlite: "namespaces",
        postgres: "namespaces",
        columns: &[
            ("number", Kind::Int, false),
            ("id", Kind::Text, false),
            ("normalization", Kind::Int, false),
            ("max_chars", Kind::Int, false),
            ("pattern", Kind::Text, true),
            ("reserved", Kind::Text, false),
            ("description", Kind::Text, false),
            ("deprecated", Kind::Bool, false),
            ("version", Kind::Int, false),
        ],
    },
    Table {
        sqlite: "leases_outstanding",
        postgres: "leases",
        columns: &[
            ("lease_id", Kind::Uuid, false),
            ("cell_id", Kind::Text, false),
            ("request", Kind::Bytes, false),
            ("created_at", Kind::Micros, false),
            ("last_renewed_at", Kind::Micros, false),
        ],
    },
    Table {
        sqlite: "claims",
        postgres: "claims",
        columns: &[
            ("claim_type", Kind::Int, false),
            ("claim_value", Kind::Text, false),
            ("cell_id", Kind::Text, false),
            ("owner_type", Kind::Int, false),
            ("owner_value", Kind::Text, false),
            ("table_name", Kind::Int, false),
            ("table_record_id", Kind::Int, false),
            ("lease_id", Kind::Uuid, true),
            ("lease_op", Kind::LeaseOp, false),
            ("created_at", Kind::Micros, false),
            ("updated_at", Kind::Micros, false),
            ("display_value", Kind::Text, true),
            ("namespace", Kind::Text, true),
            ("owner_type_name", Kind::Text, true),
            ("source_table", Kind::Text, true),
        ],
    },
    Table {
        sqlite: "lease_outcomes",
        postgres: "lease_outcomes",
        columns: &[
            ("lease_id", Kind::Uuid, false),
            ("cell_id", Kind::Text, false),
            ("outcome", Kind::Int, false),
            ("decided_at", Kind::Micros, false),
        ],
    },
    Table {
        sqlite: "decommissioned_cells",
        postgres: "decommissioned_cells",
        columns: &[
            ("cell_id", Kind::Text, false),
            ("decommissioned_at", Kind::Micros, false),
        ],
    },
    Table {
        sqlite: "restore_epochs",
        postgres: "restore_epochs",
        columns: &[
            ("epoch", Kind::Int, false),
            ("backup_time", Kind::Micros, false),
            ("marked_at", Kind::Micros, false),
            ("reason", Kind::Text, false),
            ("expected_cells", Kind::Text, false),
            ("lifted_at", Kind::Micros, true),
            ("lift_reason", Kind::Text, true),
        ],
    },
    Table {
        sqlite: "restore_reports",
        postgres: "restore_reports",
        columns: &[
            ("epoch", Kind::Int, false),
            ("cell_id", Kind::Text, false),
            ("reported_at", Kind::Micros, false),
        ],
    },
];

/// The rows of one of [`TABLES`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableRows {
    pub rows: Vec<Vec<Value>>,
}

/// A whole store: the rows of each of [`TABLES`], in that order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreRows {
    pub tables: Vec<TableRows>,
}

impl StoreRows {
    /// The rows of the table whose SQLite name is `sqlite` (empty if absent).
    pub fn rows_of(&self, sqlite: &str) -> &[Vec<Value>] {
        TABLES
            .iter()
            .position(|t| t.sqlite == sqlite)
            .and_then(|i| self.tables.get(i))
            .map_or(&[], |t| t.rows.as_slice())
    }
}
