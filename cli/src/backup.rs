//! `backup` and `restore`: online backups of the SQLite store (docs/operations.md, "Disaster
//! recovery"). PostgreSQL and Spanner stores keep their own tools, which the error names.
//!
//! Owns the commands' arguments and printing; the file work is the SQLite backend's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::store::StoreUrl;

#[derive(Args, Debug)]
pub struct BackupArgs {
    /// The store to back up: sqlite://PATH (while `serve` runs on it: the copy is one consistent
    /// snapshot).
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
    /// The backup file, as written by `topology-claims backup`.
    #[arg(long, env = "TOPOLOGY_CLAIMS_RESTORE_FROM")]
    from: PathBuf,

    /// The store to restore into: sqlite://PATH.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_STORE",
        default_value = "sqlite://topology-claims.db"
    )]
    store: String,

    /// Replace an existing store file. Stop every `serve` using it first. Env: true/false.
    #[arg(long, env = "TOPOLOGY_CLAIMS_RESTORE_REPLACE",
          value_parser = crate::env::switch)]
    replace: bool,
}

/// The SQLite file of `url`, or why this command cannot handle it.
fn sqlite_path(url: &str, doing: &str) -> Result<PathBuf, String> {
    match url.parse::<StoreUrl>()? {
        StoreUrl::Sqlite(path) => Ok(path),
        StoreUrl::Memory => Err(format!("memory: keeps nothing to {doing}")),
        StoreUrl::Postgres(_) => Err(format!(
            "PostgreSQL stores {doing} with PostgreSQL's own tools (pg_basebackup and WAL archiving for point-in-time recovery, or pg_dump): docs/operations.md, \"Disaster recovery\""
        )),
        StoreUrl::Spanner(_) => Err(format!(
            "Spanner stores {doing} with Spanner's backups or point-in-time recovery: docs/operations.md, \"Disaster recovery\""
        )),
    }
}

pub async fn backup(args: BackupArgs) -> ExitCode {
    let path = match sqlite_path(&args.store, "back up") {
        Ok(path) => path,
        Err(message) => return fail(&message),
    };
    eprintln!("backing up {} to {} …", path.display(), args.to.display());
    match topology_claims_sqlite::backup::backup(&path, &args.to).await {
        Ok(summary) => {
            println!("backup written: {summary}");
            ExitCode::SUCCESS
        }
        Err(message) => fail(&message),
    }
}

pub async fn restore(args: RestoreArgs) -> ExitCode {
    let path = match sqlite_path(&args.store, "restore") {
        Ok(path) => path,
        Err(message) => return fail(&message),
    };
    match topology_claims_sqlite::backup::restore(&args.from, &path, args.replace).await {
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

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}
