//! `backup` and `restore`: online backups of the SQLite and PostgreSQL stores (docs/operations.md,
//! "Disaster recovery"). A PostgreSQL backup is a SQLite store file (decision 112). Spanner
//! stores keep Spanner's own tools, which the error names.
//!
//! Owns the commands' arguments and printing; the file work is the SQLite backend's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use topology_claims::transfer::TABLES;
use topology_claims_sqlite::backup::BackupSummary;
use topology_claims_sqlite::transfer::BackupWriter;

use crate::store::StoreUrl;

#[derive(Args, Debug)]
pub struct BackupArgs {
    /// The store to back up, while `serve` runs on it (the copy is one consistent snapshot):
    /// sqlite://PATH, or postgres://… (written as a SQLite store file, which `restore` reads
    /// into PostgreSQL again, or `serve --store sqlite://FILE` serves).
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_STORE",
        default_value = "sqlite://topology-claims.db"
    )]
    store: String,

    /// The backup file to write. It must not exist: backups are never overwritten. No default.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BACKUP_TO")]
    to: PathBuf,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The backup file, as written by `topology-claims backup` (of either store).
    #[arg(long, env = "TOPOLOGY_CLAIMS_RESTORE_FROM")]
    from: PathBuf,

    /// The store to restore into: sqlite://PATH, or postgres://… (migrated to this binary's
    /// schema and empty, or given with --replace; no `serve` may use it).
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_STORE",
        default_value = "sqlite://topology-claims.db"
    )]
    store: String,

    /// Replace an existing store file, or the rows of a PostgreSQL store. Stop every `serve`
    /// using it first. Env: true/false.
    #[arg(long, env = "TOPOLOGY_CLAIMS_RESTORE_REPLACE",
          value_parser = crate::env::switch)]
    replace: bool,
}

/// What `backup` / `restore` works on: a SQLite file or a PostgreSQL database.
enum Target {
    Sqlite(PathBuf),
    Postgres(String),
}

/// The store of `url`, or why this command cannot handle it.
fn target(url: &str, doing: &str) -> Result<Target, String> {
    match url.parse::<StoreUrl>()? {
        StoreUrl::Sqlite(path) => Ok(Target::Sqlite(path)),
        StoreUrl::Postgres(url) => Ok(Target::Postgres(url)),
        StoreUrl::Memory => Err(format!("memory: keeps nothing to {doing}")),
        StoreUrl::Spanner(_) => Err(format!(
            "Spanner stores {doing} with Spanner's backups or point-in-time recovery: docs/operations.md, \"Disaster recovery\""
        )),
    }
}

pub async fn backup(args: BackupArgs) -> ExitCode {
    let written = match target(&args.store, "back up") {
        Ok(Target::Sqlite(path)) => {
            eprintln!("backing up {} to {} …", path.display(), args.to.display());
            topology_claims_sqlite::backup::backup(&path, &args.to).await
        }
        Ok(Target::Postgres(url)) => postgres_backup(&url, &args.to).await,
        Err(message) => Err(message),
    };
    match written {
        Ok(summary) => {
            println!("backup written: {summary}");
            ExitCode::SUCCESS
        }
        Err(message) => fail(&message),
    }
}

/// A PostgreSQL store's snapshot, written as a SQLite store file (decision 112).
async fn postgres_backup(url: &str, to: &std::path::Path) -> Result<BackupSummary, String> {
    let shown = topology_claims_postgres::redacted_url(url);
    eprintln!("backing up {shown} to {} (one snapshot) …", to.display());
    let mut writer = BackupWriter::create(to)?;
    let mut progress = Progress::default();
    topology_claims_postgres::transfer::export(
        url,
        &topology_claims_postgres::PostgresOptions::default(),
        |table, rows| {
            // A whole chunk, synchronously: this command runs nothing else meanwhile.
            writer.insert(table, &rows)?;
            progress.add(table, rows.len());
            Ok(())
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    progress.done();
    writer.finish()
}

pub async fn restore(args: RestoreArgs) -> ExitCode {
    let restored = match target(&args.store, "restore") {
        Ok(Target::Sqlite(path)) => {
            topology_claims_sqlite::backup::restore(&args.from, &path, args.replace).await
        }
        Ok(Target::Postgres(url)) => postgres_restore(&args.from, &url, args.replace).await,
        Err(message) => Err(message),
    };
    match restored {
        Ok(summary) => {
            println!("restored: {summary}");
            // The backup file's modification time is when `backup` renamed it into place: the
            // backup time, unless the file was copied since (then use the schedule's time).
            let taken = std::fs::metadata(&args.from)
                .and_then(|m| m.modified())
                .map(|t| prost_types::Timestamp::from(t).to_string())
                .unwrap_or_else(|_| "BACKUP_TIME".to_owned());
            println!(
                "before the cells write again, start serve and mark the restore (docs/operations.md, \"After a restore\"): claims committed or destroyed after the backup are not in it:\n  topology-claims admin mark-restored --backup-time {taken} --reason \"…\"\n(the backup time shown is {}'s modification time)",
                args.from.display()
            );
            ExitCode::SUCCESS
        }
        Err(message) => fail(&message),
    }
}

/// Fills a PostgreSQL store from a backup file: the file is read on a thread of its own and
/// handed over in chunks, written in one transaction.
async fn postgres_restore(
    from: &std::path::Path,
    url: &str,
    replace: bool,
) -> Result<BackupSummary, String> {
    let summary = topology_claims_sqlite::transfer::check_backup(from)?;
    let shown = topology_claims_postgres::redacted_url(url);
    eprintln!("restoring {} into {shown} …", from.display());
    let (send, receive) = tokio::sync::mpsc::channel(4);
    let file = from.to_path_buf();
    let reader = std::thread::spawn(move || {
        let chunk = topology_claims_postgres::transfer::CHUNK_ROWS;
        let read = topology_claims_sqlite::transfer::read_rows(&file, chunk, |table, rows| {
            send.blocking_send(Ok((table, rows)))
                .map_err(|_| "the restore stopped".to_owned())
        });
        if let Err(message) = read {
            let _ = send.blocking_send(Err(message));
        }
    });
    let imported = topology_claims_postgres::transfer::import(
        url,
        &topology_claims_postgres::PostgresOptions::default(),
        replace,
        receive,
    )
    .await;
    let _ = reader.join();
    let imported = imported.map_err(|e| e.to_string())?;
    for (spec, rows) in TABLES.iter().zip(&imported.rows) {
        eprintln!("restore: {}: {rows} rows", spec.postgres);
    }
    if imported.replaced > 0 {
        eprintln!(
            "restore: replaced {} rows the store held",
            imported.replaced
        );
    }
    Ok(BackupSummary {
        path: PathBuf::from(shown),
        ..summary
    })
}

/// Rows written per table, said on stderr every 100,000 rows and at each table's end.
#[derive(Default)]
struct Progress {
    table: Option<usize>,
    rows: usize,
}

impl Progress {
    fn add(&mut self, table: usize, rows: usize) {
        if self.table != Some(table) {
            self.done();
            self.table = Some(table);
        }
        let before = self.rows;
        self.rows += rows;
        if before / 100_000 != self.rows / 100_000 {
            eprintln!("backup: {}: {} rows …", TABLES[table].postgres, self.rows);
        }
    }

    fn done(&mut self) {
        if let Some(table) = self.table.take() {
            eprintln!("backup: {}: {} rows", TABLES[table].postgres, self.rows);
        }
        self.rows = 0;
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}
