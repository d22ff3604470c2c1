//! A store of another backend as a SQLite backup file, and back (`topology-claims backup` /
//! `restore` of a PostgreSQL store; decision 112). The file is a SQLite store like any other:
//! `serve --store sqlite://FILE` serves it, `restore` checks it the same way.
//!
//! Writing: [`BackupWriter`] creates `TO.partial` exclusively, applies every migration, takes
//! the rows table by table ([`topology_claims::transfer::TABLES`] order) in one transaction, then
//! checks the file, syncs it and links it as `TO` (never an overwrite), as a SQLite backup does.
//! Reading: [`read_rows`] hands a backup's rows over in chunks, so neither side holds a whole
//! store in memory.

use std::path::{Path, PathBuf};

use rusqlite::{params_from_iter, Connection, OpenFlags};
use topology_claims::transfer::{Value, TABLES};
use topology_claims::{MigrationPolicy, SystemClock};

use crate::backup::{sibling, summarize, sync_and_link, BackupSummary};

/// A backup file being written from another store's rows.
pub struct BackupWriter {
    conn: Option<Connection>,
    partial: PathBuf,
    to: PathBuf,
}

impl BackupWriter {
    /// Starts the backup `to`, which must not exist.
    pub fn create(to: &Path) -> Result<Self, String> {
        if std::fs::symlink_metadata(to).is_ok() {
            return Err(format!(
                "backup target {} exists; backups are never overwritten: choose a new file",
                to.display()
            ));
        }
        let partial = sibling(to, "partial")?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    format!(
                        "{} exists: another backup to {} is running, or one crashed; check, \
                         remove it, and run the backup again",
                        partial.display(),
                        to.display()
                    )
                } else {
                    format!("cannot create {}: {e}", partial.display())
                }
            })?;
        let mut writer = Self {
            conn: None,
            partial,
            to: to.to_path_buf(),
        };
        let opened = (|| {
            let mut conn = Connection::open(&writer.partial).map_err(|e| e.to_string())?;
            crate::migrations::run_logged(&mut conn, MigrationPolicy::Apply, &SystemClock, false)
                .map_err(|e| e.into_claims().to_string())?;
            // The rows bring their own namespaces (the built-ins included, as the store had them).
            conn.execute_batch("BEGIN; DELETE FROM namespaces;")
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(conn)
        })();
        match opened {
            Ok(conn) => writer.conn = Some(conn),
            Err(e) => return Err(writer.fail(format!("creating the backup schema: {e}"))),
        }
        Ok(writer)
    }

    /// Adds `rows` of `TABLES[table]`.
    pub fn insert(&mut self, table: usize, rows: &[Vec<Value>]) -> Result<(), String> {
        let conn = self.conn.as_ref().ok_or("the backup was abandoned")?;
        let spec = &TABLES[table];
        let columns: Vec<&str> = spec.columns.iter().map(|c| c.0).collect();
        let marks: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            spec.sqlite,
            columns.join(", "),
            marks.join(", ")
        );
        let mut statement = conn
            .prepare_cached(&sql)
            .map_err(|e| format!("{}: {e}", spec.sqlite))?;
        for row in rows {
            let values = row.iter().map(|v| match v {
                Value::Null => rusqlite::types::Value::Null,
                Value::Int(n) => rusqlite::types::Value::Integer(*n),
                Value::Text(t) => rusqlite::types::Value::Text(t.clone()),
                Value::Bytes(b) => rusqlite::types::Value::Blob(b.clone()),
            });
            statement
                .execute(params_from_iter(values))
                .map_err(|e| format!("writing a row of {}: {e}", spec.sqlite))?;
        }
        Ok(())
    }

    /// Commits the rows, checks the file and places it at `to`.
    pub fn finish(mut self) -> Result<BackupSummary, String> {
        let Some(conn) = self.conn.take() else {
            return Err("the backup was abandoned".into());
        };
        if let Err(e) = conn.execute_batch("COMMIT") {
            return Err(self.fail(format!("committing the backup: {e}")));
        }
        drop(conn);
        let summary = match summarize(&self.partial) {
            Ok(summary) => summary,
            Err(e) => {
                let message = format!("the copy {} is not sound: {e}", self.partial.display());
                return Err(self.fail(message));
            }
        };
        if let Err(e) = sync_and_link(&self.partial, &self.to) {
            return Err(self.fail(e));
        }
        Ok(BackupSummary {
            path: self.to.clone(),
            ..summary
        })
    }

    /// Removes the partial file; returns `message` to pass on.
    fn fail(&mut self, message: String) -> String {
        self.conn = None;
        let _ = std::fs::remove_file(&self.partial);
        message
    }
}

impl Drop for BackupWriter {
    fn drop(&mut self) {
        // Not finished (an error on the other side): leave no partial file behind.
        if self.conn.take().is_some() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Checks the backup `from` (a sound store file at this binary's latest schema) and says what
/// it holds.
pub fn check_backup(from: &Path) -> Result<BackupSummary, String> {
    let summary = summarize(from).map_err(|e| format!("backup {}: {e}", from.display()))?;
    let latest = crate::migrations::latest_name();
    if summary.schema != latest {
        return Err(format!(
            "backup {} is at schema {}, this binary writes {latest}: restore it with the release \
             that took it, or migrate a copy first (topology-claims migrate --store \
             sqlite://COPY)",
            from.display(),
            summary.schema
        ));
    }
    Ok(summary)
}

/// Hands the rows of every table of the backup `from` to `send`, `(table, rows)` in
/// [`TABLES`] order, at most `chunk` rows at a time.
pub fn read_rows(
    from: &Path,
    chunk: usize,
    mut send: impl FnMut(usize, Vec<Vec<Value>>) -> Result<(), String>,
) -> Result<(), String> {
    let conn = Connection::open_with_flags(from, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("opening {}: {e}", from.display()))?;
    // One read transaction: the chunks are one snapshot of the file.
    conn.execute_batch("BEGIN")
        .map_err(|e| format!("{}: {e}", from.display()))?;
    for (index, spec) in TABLES.iter().enumerate() {
        let columns: Vec<&str> = spec.columns.iter().map(|c| c.0).collect();
        let sql = format!("SELECT {} FROM {}", columns.join(", "), spec.sqlite);
        let mut statement = conn
            .prepare(&sql)
            .map_err(|e| format!("reading {}: {e}", spec.sqlite))?;
        let mut rows = statement
            .query([])
            .map_err(|e| format!("reading {}: {e}", spec.sqlite))?;
        let mut batch = Vec::with_capacity(chunk);
        while let Some(row) = rows
            .next()
            .map_err(|e| format!("reading {}: {e}", spec.sqlite))?
        {
            let mut values = Vec::with_capacity(columns.len());
            for (i, column) in columns.iter().enumerate() {
                use rusqlite::types::ValueRef;
                let value = row
                    .get_ref(i)
                    .map_err(|e| format!("reading {}: {e}", spec.sqlite))?;
                values.push(match value {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(n) => Value::Int(n),
                    ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
                    ValueRef::Real(_) => {
                        return Err(format!("{}.{column}: a real number", spec.sqlite))
                    }
                });
            }
            batch.push(values);
            if batch.len() == chunk {
                send(
                    index,
                    std::mem::replace(&mut batch, Vec::with_capacity(chunk)),
                )?;
            }
        }
        if !batch.is_empty() {
            send(index, batch)?;
        }
    }
    Ok(())
}
