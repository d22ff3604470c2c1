//! [`SpannerClaimStore`]: the [`ClaimStore`] port on one Spanner database.
//!
//! Every write is one read-write transaction that reads the rows the request touches (point
//! reads by primary key, which lock them), asks `topology_claims::domain`, and buffers exactly
//! the mutations the decision names; the commit timestamp is the time of everything written.
//! A group of BeginUpdate / CommitUpdate / RollbackUpdate calls (`ClaimStore::run_group`, the
//! combiner's) is one such transaction too: at most four multi-key reads, `domain::decide_group`,
//! the net mutations, one commit.
//! Reads are strong read-only snapshots. Owns the transaction shapes; must not decide protocol
//! questions (that is `domain`) nor classify errors (that is `error.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use gcloud_spanner::client::{Client, ReadOnlyTransactionOption};
use gcloud_spanner::key::Key;
use gcloud_spanner::row::Row;
use gcloud_spanner::statement::Statement;
use gcloud_spanner::transaction::{QueryOptions, ReadOptions, Transaction};
use gcloud_spanner::value::TimestampBound;
use topology_claims::domain::{
    self, BeginPlan, DecommissionPlan, DecommissionState, DecommissionStep, EndPlan, EndWrites,
    EventsPage, EventsQuery, GroupOp, GroupResults, LeaseOutcome, LeaseRecord, LeaseSummary,
    MarkRestored, NamespaceSpec, NamespaceUpdate, RestoreEpoch, SlotGrant, SlotHolder, SlotLimit,
    StoredNamespace,
};
use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimStore, ClaimsError, ClaimsPage, ClaimsQuery, Lease,
    LeaseId, LeaseOp, LeasesPage, LeasesQuery, MigrationPolicy, Timestamp,
};

use crate::config::{DatabaseName, SpannerOptions};
use crate::error::{client_error, status_error, TxError};
use crate::rows::{
    self, CLAIMS, CLAIM_COLUMNS, DECOMMISSIONED, LEASES, LEASE_COLUMNS, OUTCOMES, OUTCOME_COLUMNS,
    SLOTS,
};
use crate::schema;
use crate::transaction::{Attempts, WriteTx};

/// Most rows one group transaction writes. Spanner refuses a commit of more than 80,000
/// mutations, counted per column written and per index entry changed: a claim row costs up to
/// about 20 (16 columns, three indexes) and its change feed event 18 more, so 2,000 rows keep a
/// group well inside the limit. A
/// bigger group is split in two, each half its own transaction, in order (a lone operation of
/// `--max-batch` claims is far below it).
pub(crate) const GROUP_MAX_ROWS: usize = 2000;
/// Spanner's earliest TIMESTAMP, 0001-01-01T00:00:00Z: a cutoff at or before it selects nothing
/// (and could not be sent as a parameter).
pub(crate) const SPANNER_MIN_TIMESTAMP: Timestamp =
    Timestamp::from_unix_micros(-62_135_596_800_000_000);

type ReadOnly = gcloud_spanner::transaction_ro::ReadOnlyTransaction;

/// The service's store on Cloud Spanner (or its emulator).
pub struct SpannerClaimStore {
    pub(crate) client: Client,
    pub(crate) options: SpannerOptions,
    name: DatabaseName,
    /// Transactions re-run by [`Attempts`] (aborts, lost sessions), for `ClaimStore::retries`.
    retries: AtomicU64,
}

impl std::fmt::Debug for SpannerClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpannerClaimStore")
            .field("database", &self.name.to_string())
            .finish()
    }
}

/// Opens a data client on an existing database.
pub(crate) async fn data_client(
    name: &DatabaseName,
    options: &SpannerOptions,
) -> Result<Client, ClaimsError> {
    let config = options.client_config().await?;
    let opened = Client::new(name.database_path(), config).await;
    opened.map_err(|e| match client_error(&format!("opening {name}"), &e) {
        // The usual first-run mistake: say how to create the database.
        ClaimsError::Unavailable { message } if message.contains("not found") => {
            let fix = format!(
                "create it with `topology-claims migrate --create-database --store {name}`"
            );
            ClaimsError::Unavailable {
                message: format!("{message}; {fix}"),
            }
        }
        other => other,
    })
}

impl SpannerClaimStore {
    pub(crate) fn from_parts(client: Client, options: SpannerOptions, name: DatabaseName) -> Self {
        Self {
            client,
            options,
            name,
            retries: AtomicU64::new(0),
        }
    }

    /// Connects to `spanner://projects/P/instances/I/databases/D`, then applies pending schema
    /// migrations or refuses with `MigrationsPending`, per `policy`.
    pub async fn connect(
        url: &str,
        options: SpannerOptions,
        policy: MigrationPolicy,
    ) -> Result<Self, ClaimsError> {
        let name = DatabaseName::parse(url)?;
        options.check()?;
        let client = data_client(&name, &options).await?;
        if let Err(error) = schema::ensure(&client, &name, &options, policy).await {
            client.close().await;
            return Err(error);
        }
        let store = Self::from_parts(client, options, name);
        if policy == MigrationPolicy::Apply {
            if let Err(error) = store.adopt_builtins().await {
                store.client.close().await;
                return Err(error);
            }
        }
        Ok(store)
    }

    /// The database this store uses.
    pub fn database(&self) -> &DatabaseName {
        &self.name
    }

    /// Deletes the store's Spanner sessions. Dropping the store without closing leaves them to
    /// expire on the server (about an hour).
    pub async fn close(self) {
        self.client.close().await;
    }

    /// The attempts of one write operation, counted in `retries`.
    pub(crate) fn attempts(&self, what: &'static str) -> Attempts<'_> {
        Attempts::new(&self.options, what).counted(&self.retries)
    }

    pub(crate) fn read_options(&self) -> ReadOptions {
        ReadOptions {
            call_options: self.options.call_options(),
            ..Default::default()
        }
    }

    fn query_options(&self) -> QueryOptions {
        QueryOptions {
            call_options: self.options.call_options(),
            ..Default::default()
        }
    }

    /// A strong read-only snapshot and its read timestamp (the store's "now").
    pub(crate) async fn snapshot(
        &self,
        context: &str,
    ) -> Result<(ReadOnly, Timestamp), ClaimsError> {
        let (tx, nanos) = self.snapshot_revision(context).await?;
        let micros = i64::try_from(nanos / 1000).unwrap_or(i64::MAX);
        Ok((tx, Timestamp::from_unix_micros(micros)))
    }

    /// A strong read-only snapshot and its read timestamp in nanoseconds since the epoch (the
    /// change feed's revision through which every commit is visible).
    pub(crate) async fn snapshot_revision(
        &self,
        context: &str,
    ) -> Result<(ReadOnly, u64), ClaimsError> {
        let option = ReadOnlyTransactionOption {
            timestamp_bound: TimestampBound::strong_read(),
            call_options: self.options.call_options(),
        };
        let tx = self
            .options
            .within_rpc_timeout(self.client.read_only_transaction_with_option(option))
            .await
            .map_err(|e| client_error(context, &e))?;
        let read_at = tx.rts.ok_or_else(|| {
            ClaimsError::internal(format!("{context}: Spanner returned no read timestamp"))
        })?;
        Ok((
            tx,
            u64::try_from(read_at.unix_timestamp_nanos()).unwrap_or_default(),
        ))
    }

    /// Runs a query and decodes every row it returns.
    pub(crate) async fn query_all<T>(
        &self,
        tx: &mut Transaction,
        stmt: Statement,
        context: &str,
        decode: impl Fn(&Row) -> Result<T, ClaimsError>,
    ) -> Result<Vec<T>, ClaimsError> {
        let failed = |s: gcloud_gax::grpc::Status| status_error(context, &s);
        let query = rows::all_rows(tx.query_with_option(stmt, self.query_options()));
        let rows = self
            .options
            .within_rpc_timeout(query)
            .await
            .map_err(failed)?;
        rows.iter().map(decode).collect()
    }

    /// What is known of a lease id: its outstanding row, else its remembered outcome.
    async fn lease_record(
        &self,
        tx: &mut Transaction,
        lease_id: LeaseId,
    ) -> Result<Option<LeaseRecord>, TxError> {
        let key = rows::lease_key(lease_id);
        let outstanding =
            tx.read_row_with_option(LEASES, &LEASE_COLUMNS, key.clone(), self.read_options());
        if let Some(row) = self.options.within_rpc_timeout(outstanding).await? {
            return Ok(Some(LeaseRecord::Outstanding(rows::lease_from_row(&row)?)));
        }
        let ended = tx.read_row_with_option(OUTCOMES, &OUTCOME_COLUMNS, key, self.read_options());
        match self.options.within_rpc_timeout(ended).await? {
            Some(row) => Ok(Some(LeaseRecord::Ended(rows::outcome_from_row(&row)?))),
            None => Ok(None),
        }
    }

    /// The current rows of these claims (absent keys are simply missing from the map).
    /// Their images are remembered for the change feed's events (`watch::ClaimChanges`).
    pub(crate) async fn claims(
        &self,
        tx: &mut WriteTx,
        keys: &BTreeSet<&ClaimKey>,
    ) -> Result<BTreeMap<ClaimKey, Claim>, TxError> {
        let keys = keys.iter().map(|k| rows::claim_key(k)).collect();
        let read = self
            .read_keys(tx, CLAIMS, &CLAIM_COLUMNS, keys, |row| {
                Ok((rows::claim_from_row(row)?, crate::watch::image_of(row)?))
            })
            .await?;
        let mut claims = BTreeMap::new();
        for (claim, image) in read {
            tx.changes.remember(image);
            claims.insert(claim.record.key.clone(), claim);
        }
        Ok(claims)
    }

    /// The rows of `table` at `keys`, in one Read (none without keys); inside a read-write
    /// transaction the read locks them, absent keys included.
    pub(crate) async fn read_keys<T>(
        &self,
        tx: &mut Transaction,
        table: &str,
        columns: &[&str],
        keys: Vec<Key>,
        decode: impl Fn(&Row) -> Result<T, ClaimsError>,
    ) -> Result<Vec<T>, TxError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let read = rows::all_rows(tx.read_with_option(table, columns, keys, self.read_options()));
        let rows = self.options.within_rpc_timeout(read).await?;
        Ok(rows.iter().map(decode).collect::<Result<_, _>>()?)
    }

    /// Runs a query inside a read-write transaction: a failed RPC stays a `TxError::Status`, so
    /// an abort re-runs the attempt.
    pub(crate) async fn query_in<T>(
        &self,
        tx: &mut Transaction,
        stmt: Statement,
        decode: impl Fn(&Row) -> Result<T, ClaimsError>,
    ) -> Result<Vec<T>, TxError> {
        let query = rows::all_rows(tx.query_with_option(stmt, self.query_options()));
        let rows = self.options.within_rpc_timeout(query).await?;
        Ok(rows.iter().map(decode).collect::<Result<_, _>>()?)
    }

    /// Whether `cell_id` is recorded in `decommissioned_cells` (a locking point read).
    async fn is_decommissioned(
        &self,
        tx: &mut Transaction,
        cell_id: &CellId,
    ) -> Result<bool, TxError> {
        let read = tx.read_row_with_option(
            DECOMMISSIONED,
            &["cell_id"],
            rows::decommissioned_key(cell_id),
            self.read_options(),
        );
        Ok(self.options.within_rpc_timeout(read).await?.is_some())
    }

    /// `SELECT COUNT(*) AS n` of the rows of `cell_id` through `table@index`.
    async fn count_of_cell(
        &self,
        tx: &mut Transaction,
        table_and_index: &str,
        cell_id: &CellId,
    ) -> Result<u64, TxError> {
        let mut stmt = Statement::new(format!(
            "SELECT COUNT(*) AS n FROM {table_and_index} WHERE cell_id = @cell_id"
        ));
        stmt.add_param("cell_id", &cell_id.as_str());
        let counts = self.query_in(tx, stmt, rows::count_from_row).await?;
        Ok(counts.first().copied().unwrap_or(0))
    }

    /// One attempt of a decommission step (the twin of `Tables::decommission_step`). No locking
    /// of its own: read-write transactions are serializable, so a BeginUpdate of the cell that
    /// read no mark and a step that counted no lease cannot both commit.
    async fn decommission_attempt(
        &self,
        tx: &mut WriteTx,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<Result<DecommissionStep, ClaimsError>, TxError> {
        let state = DecommissionState {
            outstanding_leases: self
                .count_of_cell(
                    tx,
                    "leases_outstanding@{FORCE_INDEX=leases_by_cell}",
                    cell_id,
                )
                .await?,
            decommissioned: self.is_decommissioned(tx, cell_id).await?,
        };
        let plan = match domain::decide_decommission(cell_id, state, dry_run, batch) {
            Ok(plan) => plan,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let claims = match plan {
            DecommissionPlan::Count => {
                self.count_of_cell(tx, "claims@{FORCE_INDEX=claims_by_table_record}", cell_id)
                    .await?
            }
            DecommissionPlan::Delete { mark, limit } => {
                // One range of claims_by_table_record (leading column cell_id), in its order.
                let mut stmt = Statement::new(
                    "SELECT claim_type, claim_value FROM claims@{FORCE_INDEX=claims_by_table_record}
                     WHERE cell_id = @cell_id
                     ORDER BY table_name, table_record_id, claim_type, claim_value LIMIT @limit",
                );
                stmt.add_param("cell_id", &cell_id.as_str());
                stmt.add_param("limit", &i64::try_from(limit).unwrap_or(i64::MAX));
                let doomed = self.query_in(tx, stmt, rows::claim_key_from_row).await?;
                let deleted = doomed.len() as u64;
                let mut mutations = Vec::with_capacity(2);
                if mark {
                    mutations.push(rows::insert_decommissioned(cell_id));
                }
                if !doomed.is_empty() {
                    mutations.push(rows::delete_claims(doomed));
                }
                tx.buffer_write(mutations);
                deleted
            }
        };
        Ok(Ok(DecommissionStep::after(cell_id, state, plan, claims)))
    }

    /// One attempt of a slot acquire (the twin of `Tables::acquire_verification_slot`). The
    /// whole table is read in the read-write transaction (it holds at most the limit's live rows
    /// and the expired ones not yet deleted), so two acquires that both saw a free slot cannot
    /// both commit: serializable, one aborts and re-runs. The clock is `CURRENT_TIMESTAMP()` of
    /// the transaction, and `expires_at` is written explicitly from it.
    async fn acquire_slot_attempt(
        &self,
        tx: &mut WriteTx,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<Result<SlotGrant, ClaimsError>, TxError> {
        let now = self.clock_in(tx).await?;
        let slots = self
            .query_in(
                tx,
                Statement::new(format!("SELECT cell_id, holder, expires_at FROM {SLOTS}")),
                rows::slot_from_row,
            )
            .await?;
        let plan = match domain::decide_acquire(&slots, holder, limit, now) {
            Ok(plan) => plan,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let mut mutations = Vec::with_capacity(2);
        if !plan.expired.is_empty() {
            mutations.push(rows::delete_slots(
                plan.expired.iter().map(rows::slot_key).collect(),
            ));
        }
        mutations.push(rows::upsert_slot(holder, plan.grant.expires_at));
        tx.buffer_write(mutations);
        Ok(Ok(plan.grant))
    }

    /// One attempt of a slot release: a locking point read of the holder's row, then its delete.
    async fn release_slot_attempt(
        &self,
        tx: &mut WriteTx,
        holder: &SlotHolder,
    ) -> Result<Result<bool, ClaimsError>, TxError> {
        let read = tx.read_row_with_option(
            SLOTS,
            &["cell_id", "holder", "expires_at"],
            rows::slot_key(holder),
            self.read_options(),
        );
        let row = self.options.within_rpc_timeout(read).await?;
        let row = row.map(|row| rows::slot_from_row(&row)).transpose()?;
        let release = domain::decide_release(row.as_ref(), holder);
        if release {
            tx.buffer_write(vec![rows::delete_slots(vec![rows::slot_key(holder)])]);
        }
        Ok(Ok(release))
    }

    /// One attempt of BeginUpdate: read, decide, buffer the writes. The decommission mark is
    /// read first (serializable: a step that marks the cell meanwhile aborts one of the two).
    async fn begin_attempt(
        &self,
        tx: &mut WriteTx,
        sent: &BeginUpdate,
        lease_id: LeaseId,
    ) -> Result<Result<(BeginPlan, BeginUpdate), ClaimsError>, TxError> {
        // The keys under the rules as this transaction reads (and locks) them.
        let named = sent.operations().map(|(_, r)| r.key.namespace.clone());
        let namespaces = self.read_named(tx, named).await?;
        let request = match domain::prepare_begin(sent.clone(), &namespaces) {
            Ok(request) => request,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let request = &request;
        let decommissioned = self.is_decommissioned(tx, &request.cell_id).await?;
        if let Err(refusal) = domain::check_not_decommissioned(&request.cell_id, decommissioned) {
            return Ok(Err(refusal));
        }
        let known = self.lease_record(tx, lease_id).await?;
        // A known lease id is answered from the lease alone (see decide_begin): skip the claims.
        let current = if known.is_some() {
            BTreeMap::new()
        } else {
            let keys = request.operations().map(|(_, r)| &r.key).collect();
            self.claims(tx, &keys).await?
        };
        let plan =
            match domain::decide_begin(request, lease_id, known.as_ref(), &current, &namespaces) {
                Ok(plan) => plan,
                Err(refusal) => return Ok(Err(refusal)),
            };
        if let BeginPlan::Apply(writes) = &plan {
            let marks = writes.marks.len() + writes.update_marks.len();
            let mut mutations = Vec::with_capacity(writes.inserts.len() + marks + 1);
            mutations.push(rows::insert_lease(writes.lease_id, request));
            mutations.extend(
                writes
                    .inserts
                    .iter()
                    .map(|r| rows::insert_claim(r, &request.cell_id, writes.lease_id)),
            );
            mutations.extend(
                writes
                    .marks
                    .iter()
                    .map(|k| rows::mark_claim(k, writes.lease_id, LeaseOp::Destroy)),
            );
            mutations.extend(
                writes
                    .update_marks
                    .iter()
                    .map(|k| rows::mark_claim(k, writes.lease_id, LeaseOp::Update)),
            );
            tx.buffer_write(mutations);
        }
        Ok(Ok((plan, request.clone())))
    }

    /// The store's clock inside a read-write transaction (`CURRENT_TIMESTAMP()`), read after
    /// the rows it is compared with were read (and so locked).
    pub(crate) async fn clock_in(&self, tx: &mut WriteTx) -> Result<Timestamp, TxError> {
        let clock = self
            .query_in(
                tx,
                Statement::new("SELECT CURRENT_TIMESTAMP() AS now"),
                rows::now_from_row,
            )
            .await?;
        Ok(clock
            .first()
            .copied()
            .ok_or_else(|| ClaimsError::internal("CURRENT_TIMESTAMP() returned no row"))?)
    }

    /// One attempt of CommitUpdate / RollbackUpdate (`unrenewed_for`: a conditional rollback's
    /// window, judged by the clock of this transaction after the lease row is read).
    async fn end_attempt(
        &self,
        tx: &mut WriteTx,
        caller: &CellId,
        lease_id: LeaseId,
        outcome: LeaseOutcome,
        unrenewed_for: Option<Duration>,
    ) -> Result<Result<(), ClaimsError>, TxError> {
        let known = self.lease_record(tx, lease_id).await?;
        let decided = match outcome {
            LeaseOutcome::Committed => domain::decide_commit(caller, lease_id, known.as_ref()),
            LeaseOutcome::RolledBack => {
                // Only a condition needs the clock (an unconditional rollback never reads it).
                let now = match unrenewed_for {
                    Some(_) => self.clock_in(tx).await?,
                    None => SPANNER_MIN_TIMESTAMP,
                };
                domain::decide_rollback(caller, lease_id, known.as_ref(), unrenewed_for, now)
            }
        };
        let writes = match decided {
            Err(refusal) => return Ok(Err(refusal)),
            Ok(EndPlan::AlreadyDone) => return Ok(Ok(())),
            Ok(EndPlan::Apply(writes)) => writes,
        };
        let EndWrites {
            lease_id,
            cell_id,
            outcome,
            delete,
            release,
            replace,
        } = writes;
        // Claim writes are conditional on the claim still carrying this lease (as in Tables).
        let keys = delete
            .iter()
            .chain(&release)
            .chain(replace.iter().map(|r| &r.key))
            .collect();
        let current = self.claims(tx, &keys).await?;
        let held = |key: &ClaimKey| {
            current
                .get(key)
                .and_then(|c| c.lease)
                .is_some_and(|l| l.lease_id == lease_id)
        };
        let mut mutations = Vec::with_capacity(release.len() + 3);
        let doomed: Vec<Key> = delete
            .iter()
            .filter(|k| held(k))
            .map(rows::claim_key)
            .collect();
        if !doomed.is_empty() {
            mutations.push(rows::delete_claims(doomed));
        }
        mutations.extend(release.iter().filter(|k| held(k)).map(rows::release_claim));
        mutations.extend(
            replace
                .iter()
                .filter(|r| held(&r.key))
                .map(rows::replace_claim),
        );
        if matches!(known, Some(LeaseRecord::Outstanding(_))) {
            mutations.push(rows::delete_lease(lease_id));
        }
        mutations.push(rows::insert_outcome(lease_id, &cell_id, outcome));
        tx.buffer_write(mutations);
        Ok(Ok(()))
    }

    async fn end_lease(
        &self,
        caller: &CellId,
        lease_id: LeaseId,
        outcome: LeaseOutcome,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        let what = match outcome {
            LeaseOutcome::Committed => "CommitUpdate",
            LeaseOutcome::RolledBack => "RollbackUpdate",
        };
        let mut attempts = self.attempts(what);
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self
                .end_attempt(&mut tx, caller, lease_id, outcome, unrenewed_for)
                .await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    /// One attempt of RenewLease.
    async fn renew_attempt(
        &self,
        tx: &mut WriteTx,
        caller: &CellId,
        lease_id: LeaseId,
    ) -> Result<Result<Lease, ClaimsError>, TxError> {
        let known = self.lease_record(tx, lease_id).await?;
        match domain::decide_renew(caller, lease_id, known.as_ref()) {
            Err(refusal) => Ok(Err(refusal)),
            Ok(lease) => {
                tx.buffer_write(vec![rows::renew_lease(lease_id)]);
                Ok(Ok(lease.clone()))
            }
        }
    }

    /// The first `query.fetch_limit()` claims after the cursor, in ListClaims order: one range
    /// of `claims_by_table_record` from the cursor's record id on, whose first claims (those of
    /// the cursor's record up to its key) the second condition skips. GoogleSQL has no row-value
    /// comparison, so `(table_record_id, claim_type, claim_value) > (@record_id, @claim_type,
    /// @claim_value)` is spelt out.
    async fn claims_page_rows(
        &self,
        tx: &mut Transaction,
        query: &ClaimsQuery,
    ) -> Result<Vec<Claim>, ClaimsError> {
        let mut stmt = Statement::new(format!(
            "SELECT {} FROM claims@{{FORCE_INDEX=claims_by_table_record}}
             WHERE cell_id = @cell_id AND table_name = @table_name
               AND IFNULL(source_table, '') = @source_table
               AND table_record_id >= @record_id
               AND (table_record_id > @record_id OR claim_type > @claim_type
                    OR (claim_type = @claim_type AND claim_value > @claim_value))
             ORDER BY table_record_id, claim_type, claim_value LIMIT @limit",
            rows::select_list(&CLAIM_COLUMNS)
        ));
        let (record_id, claim_type, claim_value) = query.cursor.start_after();
        stmt.add_param("cell_id", &query.cell_id.as_str());
        stmt.add_param("table_name", &i64::from(query.table_name.store_number()));
        let source_table = query.table_name.stored_name().unwrap_or_default();
        stmt.add_param("source_table", &source_table);
        stmt.add_param("record_id", &record_id);
        stmt.add_param("claim_type", &i64::from(claim_type));
        stmt.add_param("claim_value", &claim_value);
        stmt.add_param(
            "limit",
            &i64::try_from(query.fetch_limit()).unwrap_or(i64::MAX),
        );
        self.query_all(tx, stmt, "ListClaims", rows::claim_from_row)
            .await
    }
}

#[async_trait]
impl ClaimStore for SpannerClaimStore {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        // The batch-size policy is the front end's (`--max-batch`); stores accept any size.
        domain::check_batch(&request, usize::MAX)?;
        let lease_id = request.lease_id.unwrap_or_else(LeaseId::generate);
        let mut attempts = self.attempts("BeginUpdate");
        let (answer, committed_at) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.begin_attempt(&mut tx, &request, lease_id).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        match answer? {
            (BeginPlan::Replay(lease), _) => Ok(lease),
            (BeginPlan::Apply(writes), request) => Ok(Lease {
                lease_id: writes.lease_id,
                cell_id: request.cell_id.clone(),
                created_at: committed_at,
                last_renewed_at: committed_at,
                request,
            }),
        }
    }

    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        self.end_lease(cell_id, lease_id, LeaseOutcome::Committed, None)
            .await
    }

    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        self.end_lease(cell_id, lease_id, LeaseOutcome::RolledBack, unrenewed_for)
            .await
    }

    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        let mut attempts = self.attempts("RenewLease");
        let (answer, committed_at) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.renew_attempt(&mut tx, cell_id, lease_id).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        let mut lease = answer?;
        lease.last_renewed_at = committed_at;
        Ok(lease)
    }

    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        let context = "ListOutstandingLeases";
        let (mut tx, server_time) = self.snapshot(context).await?;
        let mut stmt = Statement::new(format!(
            "SELECT {} FROM leases_outstanding@{{FORCE_INDEX=leases_by_cell}}
             WHERE cell_id = @cell_id AND lease_id > @after
             ORDER BY lease_id LIMIT @limit",
            rows::select_list(&LEASE_COLUMNS)
        ));
        stmt.add_param("cell_id", &query.cell_id.as_str());
        // Lease ids are lowercase hyphenated UUIDs: their text order is their UUID order, and
        // every one sorts after the empty string.
        stmt.add_param(
            "after",
            &query.after.map(|id| id.to_string()).unwrap_or_default(),
        );
        stmt.add_param(
            "limit",
            &i64::try_from(query.fetch_limit()).unwrap_or(i64::MAX),
        );
        let leases = self
            .query_all(&mut tx, stmt, context, rows::lease_from_row)
            .await?;
        Ok(domain::leases_page(query, leases, server_time))
    }

    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        let (mut tx, _) = self.snapshot("ListClaims").await?;
        let rows = self.claims_page_rows(&mut tx, query).await?;
        Ok(domain::claims_page(query, rows))
    }

    async fn lookup_claim(&self, sent: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.lookup_in(sent).await
    }

    async fn count_claims(
        &self,
    ) -> Result<Vec<(topology_claims::domain::NamespaceId, u64)>, ClaimsError> {
        self.count_claims_in().await
    }

    async fn namespaces(&self) -> Result<Vec<StoredNamespace>, ClaimsError> {
        self.namespaces_in().await
    }

    async fn create_namespace(
        &self,
        spec: NamespaceSpec,
        max: usize,
    ) -> Result<StoredNamespace, ClaimsError> {
        self.create_namespace_in(spec, max).await
    }

    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        self.delete_namespace_in(id).await
    }

    async fn update_namespace(
        &self,
        id: &str,
        update: NamespaceUpdate,
    ) -> Result<StoredNamespace, ClaimsError> {
        self.update_namespace_in(id, update).await
    }

    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        self.collect_expired_outcomes(retention).await
    }

    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        let context = "lease summary";
        // The snapshot's read timestamp is the store's clock: no lease it sees is newer.
        let (mut tx, server_time) = self.snapshot(context).await?;
        let stmt = Statement::new(
            "SELECT cell_id, COUNT(*) AS outstanding, MIN(created_at) AS oldest
             FROM leases_outstanding GROUP BY cell_id",
        );
        let cells = self
            .query_all(&mut tx, stmt, context, rows::cell_leases_from_row)
            .await?;
        Ok(LeaseSummary::from_cells(server_time, cells))
    }

    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        let mut attempts = self.attempts("decommission step");
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self
                .decommission_attempt(&mut tx, cell_id, batch, dry_run)
                .await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, ClaimsError> {
        let mut attempts = self.attempts("AcquireVerificationSlot");
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.acquire_slot_attempt(&mut tx, holder, limit).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    async fn release_verification_slot(&self, holder: &SlotHolder) -> Result<bool, ClaimsError> {
        let mut attempts = self.attempts("ReleaseVerificationSlot");
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.release_slot_attempt(&mut tx, holder).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    async fn restore_state(&self) -> Result<Option<RestoreEpoch>, ClaimsError> {
        self.read_restore_state().await
    }

    async fn mark_restored(&self, request: &MarkRestored) -> Result<RestoreEpoch, ClaimsError> {
        self.write_mark(request).await
    }

    async fn report_verification_pass(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<RestoreEpoch, ClaimsError> {
        self.write_report(cell_id, epoch).await
    }

    async fn lift_quarantine(&self, epoch: u64, reason: &str) -> Result<RestoreEpoch, ClaimsError> {
        self.write_lift(epoch, reason).await
    }

    /// One read-write transaction per group, split when too large (`run_group_in_parts`).
    async fn run_group(&self, ops: &[GroupOp]) -> Result<GroupResults, ClaimsError> {
        self.run_group_in_parts(ops).await
    }

    async fn read_events(&self, query: &EventsQuery) -> Result<EventsPage, ClaimsError> {
        crate::watch::read_events(self, query).await
    }

    async fn compact_events(&self, retention: Duration, max: u64) -> Result<u64, ClaimsError> {
        crate::watch::compact_events(self, retention, max).await
    }

    /// Concurrent read-write transactions are bounded by the session pool; the emulator runs
    /// one at a time (a second one aborts), so there the combiner keeps one group in flight.
    fn group_parallelism(&self) -> usize {
        if self.options.emulator().is_some() {
            1
        } else {
            self.options.session_pool_size
        }
    }

    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}
