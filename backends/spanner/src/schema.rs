//! The schema as versioned DDL migrations, and applying them: through `UpdateDatabaseDdl`, each
//! recorded in `schema_migrations` once done; `--create-database` creates the database (and, on
//! the emulator only, the instance) with the whole schema in one operation.
//!
//! Owns the DDL and the migration bookkeeping. Must not read or write claims, leases or outcomes.
//! A migration is never edited once released: changes are new migrations appended to
//! [`MIGRATIONS`]. Every statement is idempotent (`IF NOT EXISTS`), so a migration that was
//! applied but not yet recorded (a crash in between, two migrators at once) is simply re-run.

use std::future::Future;
use std::time::Duration;

use gcloud_gax::grpc::{Code, Status};
use gcloud_gax::retry::RetrySetting;
use gcloud_googleapis::spanner::admin::database::v1::{
    CreateDatabaseRequest, DatabaseDialect, UpdateDatabaseDdlRequest,
};
use gcloud_googleapis::spanner::admin::instance::v1::{CreateInstanceRequest, Instance};
use gcloud_spanner::admin::client::Client as AdminClient;
use gcloud_spanner::client::Client;
use gcloud_spanner::key::all_keys;
use gcloud_spanner::mutation::insert_or_update;
use gcloud_spanner::statement::Statement;
use gcloud_spanner::transaction::{QueryOptions, ReadOptions};
use gcloud_spanner::value::CommitTimestamp;
use topology_claims::migrations::{plan_migrations, MigrationId};
use topology_claims::{ClaimsError, MigrationPolicy};

use crate::config::{DatabaseName, SpannerOptions};
use crate::error::{client_error, status_error};
use crate::rows::all_rows;
use crate::store::{data_client, SpannerClaimStore};
use crate::transaction::Attempts;

/// One schema version: DDL statements applied together in one `UpdateDatabaseDdl`.
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub statements: &'static [&'static str],
}

pub(crate) const MIGRATIONS_TABLE: &str = "schema_migrations";

/// Every migration, in order. The design's Spanner schema (docs/backends/spanner.md explains
/// each table and index, and why none of them is a write hotspot).
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
    version: 1,
    name: "0001_initial",
    statements: &[
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version INT64 NOT NULL,
            name STRING(100) NOT NULL,
            applied_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
        ) PRIMARY KEY (version)",
        // One row per claim key, leased or not. lease_op: 0 none, 1 create, 2 destroy (3 update
        // from 0004).
        "CREATE TABLE IF NOT EXISTS claims (
            claim_type INT64 NOT NULL,
            claim_value STRING(255) NOT NULL,
            owner_type INT64 NOT NULL,
            owner_value STRING(255) NOT NULL,
            cell_id STRING(100) NOT NULL,
            table_name INT64 NOT NULL,
            table_record_id INT64 NOT NULL,
            lease_id STRING(36),
            lease_op INT64 NOT NULL DEFAULT (0),
            created_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
            updated_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
            CONSTRAINT claims_lease_marker CHECK (
                (lease_id IS NULL AND lease_op = 0) OR (lease_id IS NOT NULL AND lease_op IN (1, 2))
            ),
        ) PRIMARY KEY (claim_type, claim_value)",
        // request: the protobuf BeginUpdateRequest exactly as the cell sent it.
        "CREATE TABLE IF NOT EXISTS leases_outstanding (
            lease_id STRING(36) NOT NULL,
            cell_id STRING(100) NOT NULL,
            request BYTES(MAX) NOT NULL,
            created_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
            last_renewed_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
        ) PRIMARY KEY (lease_id)",
        // outcome: 1 committed, 2 rolled back. decided_shard spreads the decided_at index.
        "CREATE TABLE IF NOT EXISTS lease_outcomes (
            lease_id STRING(36) NOT NULL,
            cell_id STRING(100) NOT NULL,
            outcome INT64 NOT NULL,
            decided_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
            decided_shard INT64 NOT NULL AS (ABS(MOD(FARM_FINGERPRINT(lease_id), 16))) STORED,
            CONSTRAINT lease_outcomes_known CHECK (outcome IN (1, 2)),
        ) PRIMARY KEY (lease_id)",
        "CREATE INDEX IF NOT EXISTS claims_by_cell ON claims (cell_id)",
        "CREATE NULL_FILTERED INDEX IF NOT EXISTS claims_by_lease ON claims (lease_id) STORING (lease_op)",
        "CREATE INDEX IF NOT EXISTS claims_by_table_record
            ON claims (cell_id, table_name, table_record_id, claim_type, claim_value)",
        "CREATE INDEX IF NOT EXISTS leases_by_cell ON leases_outstanding (cell_id, lease_id)",
        "CREATE INDEX IF NOT EXISTS lease_outcomes_by_decided_at ON lease_outcomes (decided_shard, decided_at)",
    ],
},
    // Cells an administrator decommissioned: written by the first real decommission step, read
    // by every BeginUpdate of the cell (a point read by primary key).
    Migration {
        version: 2,
        name: "0002_decommissioned_cells",
        statements: &["CREATE TABLE IF NOT EXISTS decommissioned_cells (
            cell_id STRING(100) NOT NULL,
            decommissioned_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
        ) PRIMARY KEY (cell_id)"],
    },
    // The fleet-wide verification slots: one row per verifier holding a slot. expires_at is
    // written explicitly (the store's clock at the acquire plus the ttl), never a commit
    // timestamp; a row past it is a free slot. Acquires read the whole table in a read-write
    // transaction, so concurrent acquires conflict and all but one abort and retry.
    Migration {
        version: 3,
        name: "0003_verification_slots",
        statements: &["CREATE TABLE IF NOT EXISTS verification_slots (
            cell_id STRING(100) NOT NULL,
            holder STRING(128) NOT NULL,
            expires_at TIMESTAMP NOT NULL,
        ) PRIMARY KEY (cell_id, holder)"],
    },
    // In-place updates lease a claim with lease_op 3. The CHECK is replaced under the same
    // name, so re-running the migration after it applied but was not recorded drops and adds
    // the new constraint again. (Only a crash between the two statements would leave the
    // constraint missing and make a re-run fail at the DROP: an operator adds it by hand.)
    Migration {
        version: 4,
        name: "0004_claim_updates",
        statements: &[
            "ALTER TABLE claims DROP CONSTRAINT claims_lease_marker",
            "ALTER TABLE claims ADD CONSTRAINT claims_lease_marker CHECK (
                (lease_id IS NULL AND lease_op = 0) OR (lease_id IS NOT NULL AND lease_op IN (1, 2, 3))
            )",
        ],
    },
    // Restore epochs (domain::restore): one row per `admin mark-restored`, every earlier one
    // kept as history; the latest (highest epoch) is the store's restore state. expected_cells
    // holds the cell ids joined with '\n' (empty: none). lifted_at and lift_reason are NULL
    // while the epoch is quarantined. restore_reports holds one row per cell that reported a
    // whole verification pass in an epoch. Every timestamp is CURRENT_TIMESTAMP() of the
    // writing transaction, written explicitly (as verification_slots.expires_at), so what the
    // port returns is what is stored.
    Migration {
        version: 5,
        name: "0005_restore_epochs",
        statements: &[
            "CREATE TABLE IF NOT EXISTS restore_epochs (
                epoch INT64 NOT NULL,
                backup_time TIMESTAMP NOT NULL,
                marked_at TIMESTAMP NOT NULL,
                reason STRING(MAX) NOT NULL,
                expected_cells STRING(MAX) NOT NULL,
                lifted_at TIMESTAMP,
                lift_reason STRING(MAX),
            ) PRIMARY KEY (epoch)",
            "CREATE TABLE IF NOT EXISTS restore_reports (
                epoch INT64 NOT NULL,
                cell_id STRING(100) NOT NULL,
                reported_at TIMESTAMP NOT NULL,
            ) PRIMARY KEY (epoch, cell_id)",
        ],
    },
    // Claim namespaces (decisions 107, 108): one row per namespace; number is what
    // claims.claim_type holds (the built-ins keep 1, 2, 3), id the name clients use;
    // normalization 1 exact, 2 ascii-case-insensitive, 3 precis-username; reserved the values
    // joined by '\n'; version one more at every change, 0 for a built-in awaiting adoption. DDL
    // cannot write rows: the first open writes the built-ins (namespaces.rs). display_value is
    // a claim's display form when it differs from its key (NULL before namespaces); namespace the id
    // of a claim outside the built-ins (claim_type holds its store number), NULL for these.
    Migration {
        version: 6,
        name: "0006_namespaces",
        statements: &[
            "CREATE TABLE IF NOT EXISTS namespaces (
                number INT64 NOT NULL,
                id STRING(63) NOT NULL,
                normalization INT64 NOT NULL,
                max_chars INT64 NOT NULL,
                pattern STRING(MAX),
                reserved STRING(MAX) NOT NULL,
                description STRING(MAX) NOT NULL,
                deprecated BOOL NOT NULL,
                version INT64 NOT NULL,
            ) PRIMARY KEY (number)",
            "CREATE UNIQUE INDEX IF NOT EXISTS namespaces_by_id ON namespaces (id)",
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS display_value STRING(MAX)",
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS namespace STRING(63)",
        ],
    },
    // Owner types and source tables outside the legacy enums (decision 111): owner_type and
    // table_name keep a number (a legacy name's, else OwnerType::store_number's hash), so that
    // claims_by_table_record still narrows a listing to one table; the name is kept beside it,
    // NULL for the legacy names. Two names may share a number: listings compare both.
    Migration {
        version: 7,
        name: "0007_open_names",
        statements: &[
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS owner_type_name STRING(63)",
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS source_table STRING(63)",
        ],
    },
    // The change feed (decision 117, watch.rs): revision_at is the commit timestamp of the
    // transaction that last wrote the claim (NULL for rows not written since); claim_events
    // holds one row per change of a claim, its whole post-image, keyed by the writing
    // transaction's commit timestamp and its place in that transaction (seq: a random tag per
    // transaction in the high 32 bits, the event's index in the low ones). Appending at the
    // tail of a timestamp key is the one write hotspot of the schema; it carries one row per
    // claim change, which the claims rows themselves already cost (docs/backends/spanner.md).
    // watch_log's one row bounds the kept history.
    Migration {
        version: 8,
        name: "0008_change_feed",
        statements: &[
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS revision_at TIMESTAMP
                OPTIONS (allow_commit_timestamp = true)",
            "CREATE TABLE IF NOT EXISTS claim_events (
                revision_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
                seq INT64 NOT NULL,
                deleted BOOL NOT NULL,
                claim_type INT64 NOT NULL,
                claim_value STRING(MAX) NOT NULL,
                owner_type INT64 NOT NULL,
                owner_value STRING(MAX) NOT NULL,
                cell_id STRING(100) NOT NULL,
                table_name INT64 NOT NULL,
                table_record_id INT64 NOT NULL,
                lease_id STRING(36),
                lease_op INT64 NOT NULL,
                display_value STRING(MAX),
                namespace STRING(63),
                owner_type_name STRING(63),
                source_table STRING(63),
                created_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
                updated_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
            ) PRIMARY KEY (revision_at, seq)",
            "CREATE TABLE IF NOT EXISTS watch_log (
                id INT64 NOT NULL,
                compacted_through TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true),
            ) PRIMARY KEY (id)",
        ],
    },
    // The store-wide line of lease waiters (decision 119): lease_wait_tickets' one row (id 0)
    // holds the last ticket given, and every join reads and writes it, so tickets grow in the
    // order waiters joined. One lease_waits row per (claim, ticket) waited for; expires_at is
    // when the waiter's server is presumed gone, and the next join deletes it.
    Migration {
        version: 9,
        name: "0009_lease_waits",
        statements: &[
            "CREATE TABLE IF NOT EXISTS lease_wait_tickets (
                id INT64 NOT NULL,
                last INT64 NOT NULL,
            ) PRIMARY KEY (id)",
            "CREATE TABLE IF NOT EXISTS lease_waits (
                namespace STRING(63) NOT NULL,
                claim_key STRING(MAX) NOT NULL,
                ticket INT64 NOT NULL,
                expires_at TIMESTAMP NOT NULL,
            ) PRIMARY KEY (namespace, claim_key, ticket)",
            "CREATE INDEX IF NOT EXISTS lease_waits_by_ticket ON lease_waits (ticket)",
        ],
    },
];

/// How many values `lease_outcomes.decided_shard` takes (`0..OUTCOME_SHARDS`).
pub(crate) const OUTCOME_SHARDS: i64 = 16;

/// Schema changes on a live database can take minutes (index backfills): poll the operation at
/// growing intervals (100 ms, 200 ms, … 5 s) for up to about 15 minutes.
fn ddl_polling() -> RetrySetting {
    RetrySetting {
        from_millis: 2,
        max_delay: Some(Duration::from_secs(5)),
        factor: 50,
        take: 200,
        codes: vec![Code::DeadlineExceeded],
    }
}

/// Schema changes are refused while another one (or, on the emulator, any transaction) is in
/// progress: try again a few times before giving up.
const DDL_ATTEMPTS: u32 = 8;

/// Brings the schema up to date (or refuses, per `policy`), as the core's one migration rule
/// says (`topology_claims::migrations`); returns the names applied.
pub(crate) async fn ensure(
    client: &Client,
    name: &DatabaseName,
    options: &SpannerOptions,
    policy: MigrationPolicy,
) -> Result<Vec<String>, ClaimsError> {
    ensure_through(client, name, options, policy, i64::MAX).await
}

/// [`ensure`] as a binary that knows the migrations up to `through` only (a previous release).
pub(crate) async fn ensure_through(
    client: &Client,
    name: &DatabaseName,
    options: &SpannerOptions,
    policy: MigrationPolicy,
    through: i64,
) -> Result<Vec<String>, ClaimsError> {
    let applied = applied(client, options).await?;
    let known: Vec<MigrationId> = MIGRATIONS
        .iter()
        .filter(|m| m.version <= through)
        .map(|m| MigrationId::new(m.version, m.name))
        .collect();
    let plan = plan_migrations(&known, &applied, policy)?;
    if let Some(warning) = plan.newer_warning() {
        tracing::warn!(database = %name, "Spanner: {warning}");
    }
    let mut names = Vec::new();
    if plan.pending.is_empty() {
        return Ok(names);
    }
    let admin = admin_client(options).await?;
    for version in plan.pending {
        let migration = MIGRATIONS
            .iter()
            .find(|m| m.version == version)
            .expect("the plan names only this binary's migrations");
        update_ddl(&admin, name, options, migration).await?;
        record(client, options, &[migration]).await?;
        tracing::info!(migration = migration.name, database = %name, "applied Spanner schema migration");
        names.push(migration.name.to_owned());
    }
    Ok(names)
}

/// The migrations recorded in `schema_migrations` (none on an empty database).
async fn applied(
    client: &Client,
    options: &SpannerOptions,
) -> Result<Vec<MigrationId>, ClaimsError> {
    let context = "reading the schema version";
    let mut tx = client
        .single()
        .await
        .map_err(|e| client_error(context, &e))?;
    let mut exists = Statement::new(
        "SELECT COUNT(*) AS n FROM information_schema.tables
         WHERE table_catalog = '' AND table_schema = '' AND table_name = @table",
    );
    exists.add_param("table", &MIGRATIONS_TABLE);
    let query_options = QueryOptions {
        call_options: options.call_options(),
        ..Default::default()
    };
    let query = async {
        let mut rows = tx.query_with_option(exists, query_options).await?;
        rows.next().await
    };
    let count: i64 = match options
        .within_rpc_timeout(query)
        .await
        .map_err(|s| status_error(context, &s))?
    {
        Some(row) => row
            .column_by_name("n")
            .map_err(|e| ClaimsError::internal(format!("{context}: {e}")))?,
        None => 0,
    };
    if count == 0 {
        return Ok(Vec::new());
    }
    // A single-use transaction serves one read: take a fresh one for the versions.
    drop(tx);
    let mut tx = client
        .single()
        .await
        .map_err(|e| client_error(context, &e))?;
    let read_options = ReadOptions {
        call_options: options.call_options(),
        ..Default::default()
    };
    let read = all_rows(tx.read_with_option(
        MIGRATIONS_TABLE,
        &["version", "name"],
        all_keys(),
        read_options,
    ));
    let rows = options
        .within_rpc_timeout(read)
        .await
        .map_err(|s| status_error(context, &s))?;
    let mut applied = Vec::new();
    for row in rows {
        let version: i64 = row
            .column_by_name("version")
            .map_err(|e| ClaimsError::internal(format!("{context}: {e}")))?;
        let name: String = row
            .column_by_name("name")
            .map_err(|e| ClaimsError::internal(format!("{context}: {e}")))?;
        applied.push(MigrationId::new(version, name));
    }
    Ok(applied)
}

/// Records migrations as applied.
async fn record(
    client: &Client,
    options: &SpannerOptions,
    migrations: &[&Migration],
) -> Result<(), ClaimsError> {
    let mutations: Vec<_> = migrations
        .iter()
        .map(|m| {
            insert_or_update(
                MIGRATIONS_TABLE,
                &["version", "name", "applied_at"],
                &[&m.version, &m.name, &CommitTimestamp::new()],
            )
        })
        .collect();
    let mut attempts = Attempts::new(options, "recording schema migrations");
    loop {
        let Some(mut tx) = attempts.begin(client).await? else {
            continue;
        };
        tx.buffer_write(mutations.clone());
        if attempts.end(&mut tx, Ok(())).await?.is_some() {
            return Ok(());
        }
    }
}

/// An admin client (instance, database and DDL operations).
pub(crate) async fn admin_client(options: &SpannerOptions) -> Result<AdminClient, ClaimsError> {
    let config = options.admin_config().await?;
    AdminClient::new(config).await.map_err(|e| {
        ClaimsError::unavailable(format!("cannot connect to the Spanner admin API: {e}"))
    })
}

async fn update_ddl(
    admin: &AdminClient,
    name: &DatabaseName,
    options: &SpannerOptions,
    migration: &Migration,
) -> Result<(), ClaimsError> {
    let context = format!("applying schema migration {}", migration.name);
    let request = UpdateDatabaseDdlRequest {
        database: name.database_path(),
        statements: migration
            .statements
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        ..Default::default()
    };
    let update = || async {
        let mut operation = admin
            .database()
            .update_database_ddl(request.clone(), Some(options.rpc_retry()))
            .await?;
        operation.wait(Some(ddl_polling())).await.map(|_| ())
    };
    retry_while_busy(&context, update)
        .await
        .map_err(|status| status_error(&context, &status))
}

/// Runs a schema operation to completion, again while Spanner refuses it because another schema
/// change (or, on the emulator, any transaction) is in progress.
async fn retry_while_busy<F, Fut>(context: &str, operation: F) -> Result<(), Status>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), Status>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match operation().await {
            Err(status) if is_busy(status.code()) && attempt < DDL_ATTEMPTS => {
                tracing::info!(%context, status = %status.message(), "schema change refused for now; retrying");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            other => return other,
        }
    }
}

/// A schema change refused because another change or transaction is in progress.
fn is_busy(code: Code) -> bool {
    matches!(code, Code::Aborted | Code::FailedPrecondition)
}

/// Creates the database with the whole schema if it does not exist (and, on the emulator, its
/// instance). Returns whether it was created; if so, every migration is applied and recorded.
pub(crate) async fn create_database(
    name: &DatabaseName,
    options: &SpannerOptions,
) -> Result<bool, ClaimsError> {
    let admin = admin_client(options).await?;
    if options.emulator().is_some() {
        create_emulator_instance(&admin, name, options).await?;
    }
    let context = format!("creating database {name}");
    let request = CreateDatabaseRequest {
        parent: name.instance_path(),
        create_statement: format!("CREATE DATABASE `{}`", name.database),
        extra_statements: MIGRATIONS
            .iter()
            .flat_map(|m| m.statements.iter().map(|s| (*s).to_owned()))
            .collect(),
        database_dialect: DatabaseDialect::GoogleStandardSql as i32,
        ..Default::default()
    };
    let create = || async {
        let mut operation = admin
            .database()
            .create_database(request.clone(), Some(options.rpc_retry()))
            .await?;
        operation.wait(Some(ddl_polling())).await.map(|_| ())
    };
    match retry_while_busy(&context, create).await {
        Ok(()) => Ok(true),
        Err(status) if status.code() == Code::AlreadyExists => Ok(false),
        Err(status) if status.code() == Code::NotFound => Err(ClaimsError::Configuration {
            message: format!(
                "{context}: instance {} does not exist ({}); create it first, e.g. `gcloud spanner instances create`",
                name.instance_path(),
                status.message()
            ),
        }),
        Err(status) => Err(status_error(&context, &status)),
    }
}

/// The emulator starts empty: create the instance the URL names. Never done on Google Cloud,
/// where an instance is billed capacity an operator chooses deliberately.
async fn create_emulator_instance(
    admin: &AdminClient,
    name: &DatabaseName,
    options: &SpannerOptions,
) -> Result<(), ClaimsError> {
    let request = CreateInstanceRequest {
        parent: name.project_path(),
        instance_id: name.instance.clone(),
        instance: Some(Instance {
            name: name.instance_path(),
            config: format!("{}/instanceConfigs/emulator-config", name.project_path()),
            display_name: name.instance.clone(),
            node_count: 1,
            ..Default::default()
        }),
    };
    let context = format!("creating emulator instance {}", name.instance_path());
    match admin
        .instance()
        .create_instance(request, Some(options.rpc_retry()))
        .await
    {
        Ok(mut operation) => match operation.wait(Some(ddl_polling())).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::AlreadyExists => Ok(()),
            Err(status) => Err(status_error(&context, &status)),
        },
        Err(status) if status.code() == Code::AlreadyExists => Ok(()),
        Err(status) => Err(status_error(&context, &status)),
    }
}

/// Records every migration as applied (after [`create_database`] created the whole schema).
pub(crate) async fn record_all(
    client: &Client,
    options: &SpannerOptions,
) -> Result<Vec<String>, ClaimsError> {
    let all: Vec<&Migration> = MIGRATIONS.iter().collect();
    record(client, options, &all).await?;
    Ok(all.iter().map(|m| m.name.to_owned()).collect())
}

/// Applies pending migrations; with `create_database`, first creates the database with the
/// whole schema if it does not exist (and, on the emulator, its instance). Returns the names of
/// the migrations applied (empty if the schema was current).
pub async fn migrate(
    url: &str,
    options: SpannerOptions,
    create_database: bool,
) -> Result<Vec<String>, ClaimsError> {
    let name = DatabaseName::parse(url)?;
    options.check()?;
    let created = create_database && self::create_database(&name, &options).await?;
    let client = data_client(&name, &options).await?;
    let applied = if created {
        record_all(&client, &options).await
    } else {
        ensure(&client, &name, &options, MigrationPolicy::Apply).await
    };
    // The built-ins' rows are data: written (adopted) here as a server's first open would.
    let store = SpannerClaimStore::from_parts(client, options, name);
    let adopted = match applied {
        Ok(applied) => store.adopt_builtins().await.map(|()| applied),
        Err(error) => Err(error),
    };
    store.client.close().await;
    adopted
}

/// The schema of an existing database brought up to migration `through` only, as the release
/// that knew no later one left it (the migration conformance suite populates such a database
/// and opens it with this release). Not for production use.
#[doc(hidden)]
pub async fn migrate_through(
    url: &str,
    options: SpannerOptions,
    through: i64,
) -> Result<Vec<String>, ClaimsError> {
    let name = DatabaseName::parse(url)?;
    let client = data_client(&name, &options).await?;
    let applied = ensure_through(&client, &name, &options, MigrationPolicy::Apply, through).await;
    client.close().await;
    applied
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_and_idempotent() {
        for (i, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version, i as i64 + 1, "{}", migration.name);
            assert!(migration
                .name
                .starts_with(&format!("{:04}_", migration.version)));
            // Re-runnable: every statement creates IF NOT EXISTS, or the migration drops a
            // constraint and adds it back under the same name (so a re-run drops the new one
            // and adds it again).
            let replaces_a_constraint = match migration.statements {
                [drop, add] => drop
                    .strip_prefix("ALTER TABLE ")
                    .and_then(|rest| rest.split_once(" DROP CONSTRAINT "))
                    .is_some_and(|(table, name)| {
                        add.starts_with(&format!("ALTER TABLE {table} ADD CONSTRAINT {name} "))
                    }),
                _ => false,
            };
            for statement in migration.statements {
                assert!(
                    statement.contains("IF NOT EXISTS") || replaces_a_constraint,
                    "re-runnable: {statement}"
                );
                assert!(
                    !statement.trim_end().ends_with(';'),
                    "UpdateDatabaseDdl takes no ';': {statement}"
                );
            }
        }
    }
}
