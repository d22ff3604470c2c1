//! The verifier: compares what a cell's records imply with the claims the service holds for the
//! cell, and corrects drift through the normal protocol (BeginUpdate + CommitUpdate).
//!
//! It walks the ListClaims pages of each table from the saved cursor, read as one StreamClaims
//! stream (a server without StreamClaims answers UNIMPLEMENTED, and the verifier pages with
//! ListClaims instead; a stream that breaks is reopened from the last page's cursor). The pages
//! are the same either way, and so is the cursor saved after each. Each page covers an id range
//! `[start_range, end_range)`, and the [`ClaimSource`] yields the claims the local records of
//! exactly that range imply. A record whose claims alone fill a page is split over pages (the
//! page's cursor points inside it): its claims are carried over and compared with the page that
//! holds the rest, so every record is compared whole. Discrepancies: *missing* (local only →
//! create), *different* (same key, other owner/record → one in-place update, so the claim is
//! never free and no other cell can take it in between), *extra* (service only → destroy). Records and claims younger than `recent` are left alone, as are
//! claims under a lease (an update is in flight). Corrections go in chunks of at most `chunk`
//! claims; a chunk refused because of one claim is retried claim by claim so one conflict (a
//! value taken by another cell: needs a human) does not block the rest.
//!
//! A correction is decided on a comparison that may be out of date by the time it is sent: the
//! page and the local records are read at different moments, and the cell's own transactions go
//! on meanwhile (an "extra" claim whose record the cell has just created again, say). So each
//! correcting lease checks again before it commits: once BeginUpdate has leased its claims, no
//! transaction of the cell can change their records (each needs a lease on the claim), so the
//! local records of the range are read once more, and a correction they no longer call for is
//! rolled back (*withdrawn*) instead of committed (decision 070). Extras wait for the end of a run
//! that walked every table and are dropped when any record of the run holds the key: a record
//! that moved (to another table or page) is corrected by one update, never destroy + create
//! (decision 071). A destroy therefore never frees a claim that the cell's committed records hold.
//!
//! Must not bypass the protocol: every correction is an ordinary lease of this cell.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::client::{ClaimsClient, ClaimsPageStream};
use crate::restore_pass;
use crate::slot::{self, HeldSlot, SlotEvent, SlotSettings};
pub use crate::source::{
    check_verify_query_columns, ClaimSource, LocalClaim, VERIFY_QUERY_COLUMNS,
};
pub use crate::verify_report::{Discrepancy, VerifyReport};
use topology_claims::domain::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimState, ClaimViewsPage, ClaimsCursor,
    ClaimsQuery, LeaseId, LeaseOp, SlotHolder, TableName, Timestamp,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::{Clock, SystemClock};

/// A claim as the service lists it: the record, its creation time (service clock), its state.
type ServiceClaim = (ClaimRecord, Timestamp, ClaimState);

/// Knobs of a verification run.
#[derive(Clone, Debug)]
pub struct VerifierConfig {
    pub cell_id: CellId,
    pub tables: Vec<TableName>,
    /// Records and claims younger than this are not corrected.
    pub recent: Duration,
    /// ListClaims page size (the size of each StreamClaims range too).
    pub page_size: usize,
    /// Read the pages as a StreamClaims stream (default), falling back to ListClaims paging
    /// against a server without it; `false`: always page with ListClaims.
    pub stream: bool,
    /// Most claims per correcting BeginUpdate.
    pub chunk: usize,
    /// Report discrepancies, change nothing (the saved cursor included: a dry run starts at the
    /// saved cursor and leaves it where it was).
    pub dry_run: bool,
    /// Stop (resumably) after this long.
    pub time_budget: Option<Duration>,
    /// Where the cursor is saved so an interrupted run resumes (`None`: always from 0).
    pub cursor_file: Option<PathBuf>,
    /// Take one of the fleet's verification slots for the run (default), waiting while all are
    /// held; `None`: run without one.
    pub slot: Option<SlotSettings>,
}

impl VerifierConfig {
    pub fn new(cell_id: CellId, tables: Vec<TableName>) -> Self {
        Self {
            cell_id,
            tables,
            recent: Duration::from_secs(3600),
            page_size: 1000,
            stream: true,
            chunk: 1000,
            dry_run: false,
            time_budget: None,
            cursor_file: None,
            slot: Some(SlotSettings::default()),
        }
    }
}

/// Where a verifier reports what happens to its slot.
type SlotEvents = Box<dyn Fn(&SlotEvent) + Send + Sync>;

/// The calls of a correcting lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CorrectionCall {
    Begin,
    Commit,
    /// The local records no longer call for the correction (or could not be read again).
    Rollback,
}

/// One call of a correcting lease, reported before it is sent (`answer: None`) and when it has
/// answered: an audit trail of everything the verifier did to the service.
#[derive(Clone, Copy, Debug)]
pub struct CorrectionEvent<'a> {
    pub lease_id: LeaseId,
    pub op: LeaseOp,
    pub records: &'a [ClaimRecord],
    pub call: CorrectionCall,
    pub answer: Option<&'a Result<(), ClaimsError>>,
}

/// Where a verifier reports its correcting calls.
type CorrectionEvents = Box<dyn Fn(&CorrectionEvent<'_>) + Send + Sync>;

/// How one correcting lease ended.
enum Corrected {
    Applied,
    /// Rolled back: the local records changed since the comparison and no longer call for it.
    Withdrawn,
}

/// The id range of one page of one table: the local records a correction is checked against
/// again.
#[derive(Clone)]
struct PageRange {
    table: TableName,
    start: i64,
    end: i64,
}

/// Most extra claims a run keeps for its end, and most keys of unmatched records it remembers.
const MAX_DEFERRED: usize = 10_000;

/// The extra claims of a run, destroyed at its end unless a record anywhere in the run holds the
/// key: one of a later page (of any table), or one skipped as recent or found missing on an
/// earlier page (the same page's records cannot: they would have made the claim *different*).
#[derive(Default)]
struct DeferredExtras {
    by_range: Vec<(PageRange, Vec<ClaimRecord>)>,
    /// Keys of `by_range` no record has been seen to hold.
    pending: HashSet<ClaimKey>,
    /// Keys of the local claims the run skipped as recent or found missing: held by a record
    /// whether or not the service knows it yet.
    unmatched: HashSet<ClaimKey>,
    /// Too many such keys to remember: no extra is destroyed this run.
    overflow: bool,
}

impl DeferredExtras {
    fn defer(&mut self, range: PageRange, records: Vec<ClaimRecord>) {
        let room = MAX_DEFERRED.saturating_sub(self.pending.len());
        if records.len() > room {
            tracing::debug!(
                left = records.len() - room,
                "too many extra claims for one run; the rest wait for the next"
            );
        }
        let records: Vec<ClaimRecord> = records.into_iter().take(room).collect();
        if records.is_empty() {
            return;
        }
        self.pending.extend(records.iter().map(|r| r.key.clone()));
        self.by_range.push((range, records));
    }

    fn held_locally(&mut self, key: &ClaimKey) {
        self.pending.remove(key);
    }

    fn held_unmatched(&mut self, key: &ClaimKey) {
        if self.unmatched.len() < MAX_DEFERRED {
            self.unmatched.insert(key.clone());
        } else {
            self.overflow = true;
        }
    }

    /// The extras no record of the run turned out to hold, by page range.
    fn into_destroys(self) -> Vec<(PageRange, Vec<ClaimRecord>)> {
        if self.overflow {
            return Vec::new();
        }
        self.by_range
            .into_iter()
            .map(|(range, records)| {
                let records = records
                    .into_iter()
                    .filter(|r| self.pending.contains(&r.key) && !self.unmatched.contains(&r.key))
                    .collect::<Vec<_>>();
                (range, records)
            })
            .filter(|(_, records)| !records.is_empty())
            .collect()
    }
}

/// Stops a run whose verification slot was lost (it expired and another verifier took it).
fn lost_slot(slot: Option<&HeldSlot>) -> Result<(), ClaimsError> {
    match slot.filter(|slot| slot.lost()) {
        Some(slot) => Err(ClaimsError::VerificationSlotLost {
            holder: slot.holder().to_string(),
        }),
        None => Ok(()),
    }
}

/// Whether the local records `local` (read while the correction's lease holds the claim) still
/// call for correcting `record` with `op`.
fn still_called_for(op: LeaseOp, record: &ClaimRecord, local: &[LocalClaim]) -> bool {
    match op {
        LeaseOp::Create | LeaseOp::Update => local.iter().any(|c| c.record == *record),
        LeaseOp::Destroy => !local.iter().any(|c| c.record.key == record.key),
    }
}

/// The verifier of one cell.
pub struct Verifier<S> {
    client: ClaimsClient,
    source: S,
    config: VerifierConfig,
    on_slot: SlotEvents,
    on_correction: CorrectionEvents,
    /// Whether this run is the cell's restore pass (its report not yet sent): only then are its
    /// corrections marked `restore_correction` (the server refuses the mark once it reported).
    in_restore_pass: std::sync::atomic::AtomicBool,
}

impl<S: ClaimSource> Verifier<S> {
    pub fn new(client: ClaimsClient, source: S, config: VerifierConfig) -> Self {
        Self {
            client,
            source,
            config,
            on_slot: Box::new(|_| {}),
            on_correction: Box::new(|_| {}),
            in_restore_pass: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Calls `on_slot` when the run waits for, takes, loses or releases its verification slot.
    pub fn on_slot(mut self, on_slot: impl Fn(&SlotEvent) + Send + Sync + 'static) -> Self {
        self.on_slot = Box::new(on_slot);
        self
    }

    /// Calls `on_correction` before and after each call of a correcting lease.
    pub fn on_correction(
        mut self,
        on_correction: impl Fn(&CorrectionEvent<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.on_correction = Box::new(on_correction);
        self
    }

    /// Verifies every configured table, calling `progress` after each page. With
    /// [`VerifierConfig::slot`], a verification slot is taken first (waiting while all are
    /// held), renewed while the run goes on, and released at its end, an error included. A run
    /// whose slot was lost (a renewal found it taken by another verifier) stops before its next
    /// correcting lease or page, with the cursor of its last whole page saved, and fails with
    /// [`ClaimsError::VerificationSlotLost`].
    pub async fn run(
        &self,
        progress: impl FnMut(&VerifyReport),
    ) -> Result<VerifyReport, ClaimsError> {
        let Some(settings) = &self.config.slot else {
            return self.run_pages(progress, None).await;
        };
        let holder = SlotHolder::new(self.config.cell_id.clone(), &settings.holder)?;
        let slot = slot::take_slot(&self.client, &holder, settings.ttl, &*self.on_slot).await?;
        let result = self.run_pages(progress, slot.as_ref()).await;
        if let Some(slot) = slot {
            if slot.lost() {
                // Another verifier holds it now: nothing to give back.
                (self.on_slot)(&SlotEvent::Lost);
                drop(slot);
            } else {
                // Reported before the call: the run no longer uses the slot, and until the
                // service has deleted it nobody else holds it, so no two reported intervals
                // overlap.
                (self.on_slot)(&SlotEvent::Released);
                if let Err(error) = slot.release(&self.client).await {
                    // It expires on its own after its time-to-live.
                    tracing::warn!(%error, "verification slot release failed");
                }
            }
        }
        result
    }

    async fn run_pages(
        &self,
        mut progress: impl FnMut(&VerifyReport),
        slot: Option<&HeldSlot>,
    ) -> Result<VerifyReport, ClaimsError> {
        let started = Instant::now();
        let mut report = VerifyReport {
            finished: true,
            ..VerifyReport::default()
        };
        let cell = &self.config.cell_id;
        let restore = restore_pass::latest_restore(&self.client, cell).await?;
        if let Some(view) = &restore {
            restore_pass::resolve_restored_leases(
                &self.client,
                &self.source,
                cell,
                view,
                self.config.dry_run,
                &mut report,
            )
            .await?;
        }
        // A restore pass must be whole: from the first record of every table.
        let restore_pass = restore.filter(|view| !view.reported);
        self.in_restore_pass
            .store(restore_pass.is_some(), std::sync::atomic::Ordering::Relaxed);
        let mut cursors = match &restore_pass {
            Some(_) => BTreeMap::new(),
            None => load_cursors(self.config.cursor_file.as_ref())?,
        };
        // In a restore pass, every record made before the mark is compared however recent: the
        // claims the restore lost may have been committed just before the disaster.
        let restore_mark = restore_pass.as_ref().map(|view| view.marked_at);
        let mut streaming = self.config.stream;
        let mut extras = DeferredExtras::default();
        'tables: for table in &self.config.tables {
            // This table's StreamClaims stream, once opened; dropped (closing it) when the
            // table is done or the time budget runs out.
            let mut stream: Option<ClaimsPageStream> = None;
            let mut cursor = ClaimsCursor::at(cursors.get(table).copied().unwrap_or(0));
            // The server's token of `cursor` (none for the saved record id a run starts at):
            // what the next page is asked with, `cursor` being the fallback of an older server.
            let mut page_token: Option<String> = None;
            // Claims of record `cursor.record_id` from earlier pages: a page that ended inside a
            // record leaves them to be compared together with the rest of the record.
            let mut carried: Vec<ServiceClaim> = Vec::new();
            loop {
                if self
                    .config
                    .time_budget
                    .is_some_and(|budget| started.elapsed() >= budget)
                {
                    report.finished = false;
                    break 'tables;
                }
                lost_slot(slot)?;
                let query = ClaimsQuery::new(
                    self.config.cell_id.clone(),
                    table.clone(),
                    cursor.clone(),
                    self.config.page_size,
                );
                let page = self
                    .next_page(&query, page_token.as_deref(), &mut stream, &mut streaming)
                    .await?;
                let split = page.split_record();
                let mut service = std::mem::take(&mut carried);
                service.extend(
                    page.claims
                        .into_iter()
                        .map(|c| (c.record, c.created_at, c.state)),
                );
                if let Some(split) = split {
                    // The page ended inside this record: its first claims wait for the rest.
                    (carried, service) = service
                        .into_iter()
                        .partition(|(record, ..)| record.table_record_id == split);
                }
                if page.start_range < page.end_range {
                    let local = self
                        .source
                        .claims_in_range(table.clone(), page.start_range, page.end_range)
                        .await?;
                    let found =
                        self.compare(local, service, restore_mark, &mut extras, &mut report);
                    if !self.config.dry_run {
                        let range = PageRange {
                            table: table.clone(),
                            start: page.start_range,
                            end: page.end_range,
                        };
                        // A lost slot stops the run between correcting leases, before this
                        // page's cursor is saved: the next run corrects the rest of the page.
                        self.correct(found, range, slot, &mut extras, &mut report)
                            .await?;
                    }
                }
                report.elapsed = started.elapsed();
                progress(&report);
                match page.next_cursor {
                    Some(next) => {
                        // Saved without its key: a resumed run reads a split record from its
                        // first claim again, as the claims carried in memory are gone.
                        cursors.insert(table.clone(), next.record_id);
                        cursor = next;
                        page_token = page.next_page_token;
                    }
                    None => {
                        cursors.remove(table);
                        self.save_cursors(&cursors)?;
                        break;
                    }
                }
                self.save_cursors(&cursors)?;
            }
        }
        // Only a run that walked every table knows that no record holds an extra claim's key
        // elsewhere; a run stopped early leaves them to the next one.
        if report.finished && !self.config.dry_run {
            for (range, records) in extras.into_destroys() {
                self.apply(records, LeaseOp::Destroy, &range, slot, &mut report)
                    .await?;
            }
        }
        if let Some(view) = restore_pass.filter(|_| !self.config.dry_run) {
            restore_pass::report_pass(&self.client, cell, &view, &mut report).await?;
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    /// The page of `query`: the next range of `stream` (opened at `query` when there is none),
    /// or the ListClaims page when `streaming` is off. A server without StreamClaims turns it
    /// off for the rest of the run; a stream that fails is dropped, that page read with
    /// ListClaims (with its retries), and the stream reopened for the next one.
    async fn next_page(
        &self,
        query: &ClaimsQuery,
        page_token: Option<&str>,
        stream: &mut Option<ClaimsPageStream>,
        streaming: &mut bool,
    ) -> Result<ClaimViewsPage, ClaimsError> {
        if *streaming && stream.is_none() {
            *stream = self.client.stream_claims(query, page_token).await?;
            if stream.is_none() {
                tracing::info!("the claims server has no StreamClaims; paging with ListClaims");
                *streaming = false;
            }
        }
        if let Some(ranges) = stream.as_mut() {
            match ranges.next().await {
                Some(Ok(page)) if page.start_range == query.cursor.record_id => return Ok(page),
                Some(Ok(page)) => tracing::warn!(
                    start_range = page.start_range,
                    expected = query.cursor.record_id,
                    "StreamClaims range out of order; reading that page with ListClaims"
                ),
                Some(Err(error)) => tracing::warn!(
                    %error,
                    "StreamClaims broke; reading that page with ListClaims and reopening"
                ),
                None => tracing::warn!(
                    "StreamClaims ended before its last range; reading that page with ListClaims"
                ),
            }
            *stream = None;
        }
        self.client.list_claims(query, page_token).await
    }

    /// Saves the cursor, except on a dry run: a dry run changes nothing, its cursor included, so
    /// the next real run still checks every record the dry run only looked at.
    fn save_cursors(&self, cursors: &BTreeMap<TableName, i64>) -> Result<(), ClaimsError> {
        if self.config.dry_run {
            return Ok(());
        }
        save_cursors(self.config.cursor_file.as_ref(), cursors)
    }

    /// Classifies one range. Returns the discrepancies to correct.
    fn compare(
        &self,
        local: Vec<LocalClaim>,
        service: Vec<ServiceClaim>,
        restore_mark: Option<Timestamp>,
        extras: &mut DeferredExtras,
        report: &mut VerifyReport,
    ) -> Vec<Discrepancy> {
        let recent_cut = SystemClock.now().saturating_sub(self.config.recent);
        let recent_cut = restore_mark.map_or(recent_cut, |mark| recent_cut.max(mark));
        let mut service: BTreeMap<ClaimKey, ServiceClaim> =
            service.into_iter().map(|s| (s.0.key.clone(), s)).collect();
        let mut found = Vec::new();
        let records: BTreeSet<i64> = local.iter().map(|c| c.record.table_record_id).collect();
        report.records_checked += records.len() as u64;
        for claim in local {
            report.claims_checked += 1;
            // A record here holds the key of a claim found extra elsewhere: it moved.
            extras.held_locally(&claim.record.key);
            let theirs = service.remove(&claim.record.key);
            if claim.created_at > recent_cut {
                report.skipped_recent += 1;
                extras.held_unmatched(&claim.record.key);
                continue;
            }
            if restore_mark.is_some() && theirs.as_ref().is_some_and(|t| t.2 != ClaimState::Active)
            {
                report.restore_unsettled += 1;
            }
            match theirs {
                None => {
                    // Until its create (or the update of a moved claim) is through, the key
                    // may still be listed extra at its old place: it must not be destroyed.
                    extras.held_unmatched(&claim.record.key);
                    found.push(Discrepancy::Missing(claim.record))
                }
                Some((record, _, _)) if record == claim.record => {}
                Some((_, created_at, state))
                    if created_at > recent_cut || state != ClaimState::Active =>
                {
                    report.skipped_recent += 1;
                }
                Some((record, _, _)) => found.push(Discrepancy::Different {
                    local: claim.record,
                    service: record,
                }),
            }
        }
        for (record, created_at, state) in service.into_values() {
            if created_at > recent_cut || state != ClaimState::Active {
                report.skipped_recent += 1;
            } else {
                found.push(Discrepancy::Extra(record));
            }
        }
        for d in &found {
            match d {
                Discrepancy::Missing(_) => report.missing += 1,
                Discrepancy::Different { .. } => report.different += 1,
                Discrepancy::Extra(_) => report.extra += 1,
            }
        }
        report.discrepancies.extend(found.iter().cloned());
        found
    }

    /// Creates and updates now; extras wait for the end of the run (a record elsewhere may
    /// still turn out to hold the key: a moved record, corrected by one update, never by a
    /// destroy and a create).
    async fn correct(
        &self,
        found: Vec<Discrepancy>,
        range: PageRange,
        slot: Option<&HeldSlot>,
        extras: &mut DeferredExtras,
        report: &mut VerifyReport,
    ) -> Result<(), ClaimsError> {
        let mut creates = Vec::new();
        let mut updates = Vec::new();
        let mut destroys = Vec::new();
        for d in found {
            match d {
                Discrepancy::Missing(r) => creates.push(r),
                // The local record is the truth: its values replace the service's in place.
                Discrepancy::Different { local, .. } => updates.push(local),
                Discrepancy::Extra(r) => destroys.push(r),
            }
        }
        self.apply(creates, LeaseOp::Create, &range, slot, report)
            .await?;
        self.apply(updates, LeaseOp::Update, &range, slot, report)
            .await?;
        extras.defer(range, destroys);
        Ok(())
    }

    async fn apply(
        &self,
        records: Vec<ClaimRecord>,
        op: LeaseOp,
        range: &PageRange,
        slot: Option<&HeldSlot>,
        report: &mut VerifyReport,
    ) -> Result<(), ClaimsError> {
        for chunk in records.chunks(self.config.chunk.max(1)) {
            lost_slot(slot)?;
            let first_try = match chunk {
                [one] => self.correct_one(one, op, range).await,
                _ => self.correct_chunk(chunk, op, range).await,
            };
            let one_by_one = match first_try {
                Ok(Corrected::Applied) => {
                    report.corrections_applied += chunk.len() as u64;
                    false
                }
                Ok(Corrected::Withdrawn) if chunk.len() == 1 => {
                    report.corrections_withdrawn += 1;
                    false
                }
                // Which of them no longer stand is for each one's own lease to find out.
                Ok(Corrected::Withdrawn) => true,
                Err(error) if error.claim().is_some() && chunk.len() > 1 => {
                    tracing::warn!(%error, "a correction chunk was refused; retrying claim by claim");
                    true
                }
                Err(error) => {
                    report.corrections_failed += chunk.len() as u64;
                    tracing::error!(%error, claims = chunk.len(), "correction failed");
                    false
                }
            };
            if !one_by_one {
                continue;
            }
            for one in chunk {
                lost_slot(slot)?;
                match self.correct_one(one, op, range).await {
                    Ok(Corrected::Applied) => report.corrections_applied += 1,
                    Ok(Corrected::Withdrawn) => report.corrections_withdrawn += 1,
                    Err(error) => {
                        report.corrections_failed += 1;
                        tracing::error!(claim = %one.key, %error, "correction refused; needs manual intervention");
                    }
                }
            }
        }
        Ok(())
    }

    /// The correction of one claim. A create refused because the claim is taken by this very
    /// cell with other values is a record that moved (to another table, or to a record in
    /// another page): it is corrected by one update to the record's values instead.
    async fn correct_one(
        &self,
        record: &ClaimRecord,
        op: LeaseOp,
        range: &PageRange,
    ) -> Result<Corrected, ClaimsError> {
        let one = std::slice::from_ref(record);
        match self.correct_chunk(one, op, range).await {
            Err(taken @ ClaimsError::ClaimTaken { .. }) if op == LeaseOp::Create => {
                let view = self.client.lookup_claim(&record.key).await?;
                let ours = view.cell_id == self.config.cell_id && view.state == ClaimState::Active;
                if !ours || view.record == *record {
                    return Err(taken);
                }
                self.correct_chunk(one, LeaseOp::Update, range).await
            }
            other => other,
        }
    }

    /// Whether the service still holds each of `records` with exactly these values (read while
    /// the correction's lease holds them, so they cannot change before it ends).
    async fn unchanged(&self, records: &[ClaimRecord]) -> Result<bool, ClaimsError> {
        for record in records {
            let view = self.client.lookup_claim(&record.key).await?;
            if view.record != *record || view.cell_id != self.config.cell_id {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One correcting lease: BeginUpdate, the local records of `range` read again while the
    /// lease holds the claims, then CommitUpdate if they still call for every correction, else
    /// RollbackUpdate.
    async fn correct_chunk(
        &self,
        records: &[ClaimRecord],
        op: LeaseOp,
        range: &PageRange,
    ) -> Result<Corrected, ClaimsError> {
        let cell_id = self.config.cell_id.clone();
        let lease_id = LeaseId::generate();
        let mut request = BeginUpdate {
            local_transaction: None,
            cell_id: cell_id.clone(),
            lease_id: Some(lease_id),
            creates: Vec::new(),
            destroys: Vec::new(),
            updates: Vec::new(),
        };
        let list = match op {
            LeaseOp::Create => &mut request.creates,
            LeaseOp::Destroy => &mut request.destroys,
            LeaseOp::Update => &mut request.updates,
        };
        *list = records.to_vec();
        let report = |call, answer: Option<&Result<(), ClaimsError>>| {
            (self.on_correction)(&CorrectionEvent {
                lease_id,
                op,
                records,
                call,
                answer,
            })
        };
        report(CorrectionCall::Begin, None);
        // Marked as a correction in the cell's restore pass: during the quarantine it brings back
        // a claim the cell's records hold (`domain::restore`). After the cell reported, the
        // server refuses the mark, and the correction is an ordinary lease.
        let begun = if self
            .in_restore_pass
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.client.begin_correction(request).await
        } else {
            self.client.begin_update(request).await
        }
        .map(drop);
        report(CorrectionCall::Begin, Some(&begun));
        begun?;
        let end = |call| async move {
            report(call, None);
            let ended = match call {
                CorrectionCall::Commit => self.client.commit_update(&cell_id, lease_id).await,
                _ => self.client.rollback_update(&cell_id, lease_id).await,
            };
            report(call, Some(&ended));
            ended
        };
        let local = self
            .source
            .claims_in_range(range.table.clone(), range.start, range.end)
            .await;
        let mut stands = match &local {
            Ok(local) => Ok(records.iter().all(|r| still_called_for(op, r, local))),
            Err(error) => Err(error.clone()),
        };
        if op == LeaseOp::Destroy && matches!(stands, Ok(true)) {
            // A destroy also needs the claim to be the one found extra: one that moved since
            // (an update of the cell's) is held by a record elsewhere.
            stands = self.unchanged(records).await;
        }
        if let Ok(true) = stands {
            return end(CorrectionCall::Commit)
                .await
                .map(|()| Corrected::Applied);
        }
        if let Err(error) = end(CorrectionCall::Rollback).await {
            // Not recorded locally, so the cell's reconciler rolls it back once it is stale.
            tracing::warn!(%error, lease = %lease_id, "rolling back a withdrawn correction failed; the reconciler will");
        }
        stands.map(|_| Corrected::Withdrawn)
    }
}

fn load_cursors(path: Option<&PathBuf>) -> Result<BTreeMap<TableName, i64>, ClaimsError> {
    let Some(path) = path else {
        return Ok(BTreeMap::new());
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => {
            return Err(ClaimsError::Configuration {
                message: format!("cannot read cursor file {}: {e}", path.display()),
            })
        }
    };
    let mut cursors = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = line.split_once('=').and_then(|(table, cursor)| {
            Some((
                TableName::from_name(table.trim())?,
                cursor.trim().parse::<i64>().ok()?,
            ))
        });
        let (table, cursor) = parsed.ok_or_else(|| ClaimsError::Configuration {
            message: format!(
                "cursor file {} has a bad line {line:?} (expected TABLE=ID)",
                path.display()
            ),
        })?;
        cursors.insert(table, cursor);
    }
    Ok(cursors)
}

fn save_cursors(
    path: Option<&PathBuf>,
    cursors: &BTreeMap<TableName, i64>,
) -> Result<(), ClaimsError> {
    let Some(path) = path else { return Ok(()) };
    let text: String = cursors
        .iter()
        .map(|(t, c)| format!("{}={c}\n", t.name()))
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| ClaimsError::Configuration {
            message: format!("cannot write cursor file {}: {e}", path.display()),
        })
}
