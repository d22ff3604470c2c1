//! The paging rules of ListOutstandingLeases and ListClaims: page sizes, where a page stops (at
//! its `limit`, or before its byte budget), and where the next one starts. A store reads the
//! first [`LeasesQuery::fetch_limit`] / [`ClaimsQuery::fetch_limit`] rows after the cursor, in
//! page order, and hands them to [`leases_page`] / [`claims_page`]; the cut is decided here, the
//! same for every store.
//!
//! The byte budget (`--max-response-bytes`) keeps every response under what gRPC clients accept
//! (4 MiB by default), so a reconciler or verifier can always read the next page. It is counted
//! with an *upper bound* of each item's protobuf encoding computed from its fields
//! ([`lease_encoded_len_bound`], [`claim_encoded_len_bound`]): the domain knows no proto types,
//! and a bound is all the rule needs (a page is never larger than its budget, and only a few
//! percent fuller could have fitted: fields proto3 would leave out are counted).
//! `grpc::convert`'s tests hold the bounds against prost's real encoding, so a new field in the
//! proto that the bounds forget fails there.
//!
//! Pure: no I/O, no clock.

use crate::domain::types::{
    CellId, Claim, ClaimRecord, ClaimsCursor, ClaimsPage, ClaimsQuery, Lease, LeaseId, LeasesPage,
    LeasesQuery, TableName, Timestamp, MAX_VALUE_LEN,
};
use crate::error::ClaimsError;

/// ListOutstandingLeases: page size for `limit = 0`, and the largest allowed.
pub const LEASES_DEFAULT_LIMIT: usize = 100;
pub const LEASES_MAX_LIMIT: usize = 1000;
/// ListClaims: page size for `limit = 0`, and the largest allowed.
pub const CLAIMS_DEFAULT_LIMIT: usize = 1000;
pub const CLAIMS_MAX_LIMIT: usize = 10_000;
/// Default budget of one list response in encoded bytes (`serve --max-response-bytes`): a
/// quarter of the 4 MiB gRPC clients accept by default.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// Interprets a requested page size: 0 means `default`; negative or above `max` is refused.
pub fn page_limit(
    requested: i32,
    default: usize,
    max: usize,
    field: &str,
) -> Result<usize, ClaimsError> {
    match requested {
        0 => Ok(default),
        n if n < 0 => Err(ClaimsError::invalid(
            field,
            format!("must not be negative, got {n}"),
        )),
        n if n as usize > max => Err(ClaimsError::invalid(
            field,
            format!("must be at most {max}, got {n}"),
        )),
        n => Ok(n as usize),
    }
}

impl LeasesQuery {
    /// A query with the default byte budget (what a client builds: the budget is the server's).
    pub fn new(cell_id: CellId, after: Option<LeaseId>, limit: usize) -> Self {
        Self {
            cell_id,
            after,
            limit,
            max_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// How many leases a store reads after the cursor (in lease-id order): one more than the
    /// page may hold, which tells whether another page follows.
    pub fn fetch_limit(&self) -> usize {
        self.limit.max(1).saturating_add(1)
    }
}

impl ClaimsQuery {
    /// A query with the default byte budget (what a client builds: the budget is the server's).
    pub fn new(cell_id: CellId, table_name: TableName, cursor: ClaimsCursor, limit: usize) -> Self {
        Self {
            cell_id,
            table_name,
            cursor,
            limit,
            max_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// How many claims a store reads after the cursor (in page order): one more than the page
    /// may hold, which tells whether the page ends and where the next one starts.
    pub fn fetch_limit(&self) -> usize {
        self.limit.max(1).saturating_add(1)
    }
}

/// A ListOutstandingLeases page from the first [`LeasesQuery::fetch_limit`] leases after the
/// cursor, in lease-id order. The page stops at `limit` leases, or earlier where the next lease
/// would take the response over `max_bytes`; it always holds at least one lease (one lease is at
/// most one BeginUpdate request, itself at most 4 MiB), so paging always advances. `next_cursor`
/// is the last lease on the page whenever leases were left out.
pub fn leases_page(
    query: &LeasesQuery,
    mut leases: Vec<Lease>,
    server_time: Timestamp,
) -> LeasesPage {
    let keep = fitting(
        leases
            .iter()
            .take(query.limit.max(1))
            .map(lease_encoded_len_bound),
        LEASES_RESPONSE_FIXED_LEN,
        query.max_bytes,
    );
    let next_cursor = if leases.len() > keep {
        leases.truncate(keep);
        leases.last().map(|l| l.lease_id)
    } else {
        None
    };
    LeasesPage {
        leases,
        next_cursor,
        server_time,
        restore: None,
    }
}

/// Leases a server reads from its store at once while assembling one ListOutstandingLeases
/// page ([`LeasesPageBuilder`]): a lease is up to one BeginUpdate (about 0.6 MB at
/// `--max-batch 1000`), so reading a page's `limit` (up to 1000) leases at once could cost
/// hundreds of MB before the byte budget cuts the page.
pub const LEASES_READ_CHUNK: usize = 16;

/// Assembles a ListOutstandingLeases page from consecutive store reads of at most
/// [`LEASES_READ_CHUNK`] leases each, so a request never holds more than the page plus one
/// chunk, whatever the leases weigh. The page is the one [`leases_page`] makes from a single
/// read: same leases, same cursor.
pub struct LeasesPageBuilder<'q> {
    query: &'q LeasesQuery,
    used: usize,
    leases: Vec<Lease>,
}

impl<'q> LeasesPageBuilder<'q> {
    pub fn new(query: &'q LeasesQuery) -> Self {
        Self {
            query,
            used: LEASES_RESPONSE_FIXED_LEN,
            leases: Vec::new(),
        }
    }

    /// The store read that comes next: after the last lease taken (or the page's cursor), for
    /// at most a chunk of what the page still has room for.
    pub fn next_read(&self) -> LeasesQuery {
        LeasesQuery {
            cell_id: self.query.cell_id.clone(),
            after: self.leases.last().map(|l| l.lease_id).or(self.query.after),
            limit: (self.query.limit.max(1) - self.leases.len()).min(LEASES_READ_CHUNK),
            max_bytes: self.query.max_bytes,
        }
    }

    /// Takes what a read returned; the finished page once it is complete, else `None` (read
    /// [`Self::next_read`] next).
    pub fn take(&mut self, read: LeasesPage) -> Option<LeasesPage> {
        for lease in read.leases {
            let size = lease_encoded_len_bound(&lease);
            if !self.leases.is_empty() && self.used.saturating_add(size) > self.query.max_bytes {
                return Some(self.finish(true, read.server_time));
            }
            self.used = self.used.saturating_add(size);
            self.leases.push(lease);
        }
        match read.next_cursor {
            None => Some(self.finish(false, read.server_time)),
            Some(_) if self.leases.len() >= self.query.limit.max(1) => {
                Some(self.finish(true, read.server_time))
            }
            Some(_) => None,
        }
    }

    fn finish(&mut self, more: bool, server_time: Timestamp) -> LeasesPage {
        let leases = std::mem::take(&mut self.leases);
        LeasesPage {
            next_cursor: if more {
                leases.last().map(|l| l.lease_id)
            } else {
                None
            },
            leases,
            server_time,
            restore: None,
        }
    }
}

/// A ListClaims page from the first [`ClaimsQuery::fetch_limit`] claims of the cell and table
/// after the cursor (`(table_record_id, claim_type, claim_value) >
/// query.cursor.start_after()`), in that order.
///
/// The page stops at `limit` claims, or earlier where the next claim would take the response
/// over `max_bytes`, with at least one claim. Where it stops:
///
/// - after the last row: the last page, `end_range = i64::MAX`, no cursor;
/// - between two record ids: `end_range` and the next cursor are the record id of the first
///   claim left out;
/// - inside record R, when the page holds claims of other records too: it is cut back to R's
///   first claim, so it ends between record ids (above);
/// - inside record R, when R's claims fill the whole page: the record is split. `end_range` is
///   R, the page holds the claims of `[start_range, R)` (there are none when the page started
///   inside R or at R) plus the first claims of R, and the next cursor is R *after the page's
///   last claim*, so the next page (`start_range` R) begins with R's remaining claims.
///
/// So the pages from cursor 0 on tile `[0, i64::MAX)` without gap or overlap, every claim is on
/// exactly one page, and a record's claims are split over pages only when it alone fills a page
/// (a reader joins them: the claims of record `end_range` carry over to the next page).
pub fn claims_page(query: &ClaimsQuery, mut rows: Vec<Claim>) -> ClaimsPage {
    let start_range = query.cursor.record_id;
    let mut keep = fitting(
        rows.iter()
            .take(query.limit.max(1))
            .map(claim_encoded_len_bound),
        CLAIMS_RESPONSE_FIXED_LEN,
        query.max_bytes,
    );
    if keep == rows.len() {
        return ClaimsPage {
            claims: rows,
            start_range,
            end_range: i64::MAX,
            next_cursor: None,
        };
    }
    let next_record = rows[keep].record.table_record_id;
    let first_of_next = rows[..keep]
        .iter()
        .position(|c| c.record.table_record_id == next_record);
    let after_key = match first_of_next {
        Some(0) => Some(rows[keep - 1].record.key.clone()),
        Some(first) => {
            keep = first;
            None
        }
        None => None,
    };
    rows.truncate(keep);
    ClaimsPage {
        claims: rows,
        start_range,
        end_range: next_record,
        next_cursor: Some(ClaimsCursor {
            record_id: next_record,
            after_key,
        }),
    }
}

/// Whether `page` may go to its client. A page that ends inside a record (it holds nothing but
/// the first claims of one record whose claims alone overflow a page) can only be continued by
/// a client that resumes inside records: one that follows `next_page_token` (or says it will,
/// `page_tokens`), or sends `next_cursor_key` back as `cursor_key`. A client that sends back
/// only `next_cursor`, as the API read before records were split, would get the same first
/// claims again, forever; it gets [`ClaimsError::RecordExceedsPage`] instead, naming the record
/// and the fix, before it has seen any of that record's claims. So such a client gets every
/// claim exactly once, or that error.
pub fn check_claims_page_followable(
    query: &ClaimsQuery,
    page: &ClaimsPage,
    resumes_inside_records: bool,
) -> Result<(), ClaimsError> {
    match page.split_record() {
        Some(record_id) if !resumes_inside_records => Err(ClaimsError::RecordExceedsPage {
            table_name: query.table_name.clone(),
            record_id,
        }),
        _ => Ok(()),
    }
}

/// Orders claims as ListClaims returns them.
pub fn claims_page_order(a: &Claim, b: &Claim) -> std::cmp::Ordering {
    (a.record.table_record_id, &a.record.key).cmp(&(b.record.table_record_id, &b.record.key))
}

/// How many of `sizes` (in order) fit in `budget` after `fixed` bytes: at least one when there
/// is one, so that paging always advances.
fn fitting(sizes: impl Iterator<Item = usize>, fixed: usize, budget: usize) -> usize {
    let mut used = fixed;
    let mut count = 0;
    for size in sizes {
        used = used.saturating_add(size);
        if used > budget && count > 0 {
            break;
        }
        count += 1;
    }
    count
}

// Protobuf wire sizes. Every field number of the API is below 16, so a tag is one byte.
const TAG: usize = 1;
/// An enum field: every enum of the API is numbered below 128, so its varint is one byte.
const ENUM: usize = TAG + 1;
/// A varint field (int32, int64) at its largest: tag and ten bytes.
const SCALAR: usize = TAG + 10;
/// A lease id (hyphenated UUID) is 36 bytes.
const LEASE_ID_LEN: usize = 36;
/// A `google.protobuf.Timestamp` field at its largest: `seconds` and `nanos`, each a scalar.
const TIMESTAMP: usize = delimited(2 * SCALAR);

const fn varint_len(value: u64) -> usize {
    let mut len = 1;
    let mut rest = value >> 7;
    while rest > 0 {
        len += 1;
        rest >>= 7;
    }
    len
}

/// An int32 / int64 field holding `value` (a negative one takes ten bytes).
const fn int_field(value: i64) -> usize {
    TAG + varint_len(value as u64)
}

/// A length-delimited field (string, message, one element of a repeated message) of `len` bytes.
const fn delimited(len: usize) -> usize {
    TAG + varint_len(len as u64) + len
}

/// A `google.protobuf.Timestamp` field holding `time`: whole seconds and the nanoseconds past
/// them, as `codec::timestamp_to_pb` splits it.
fn timestamp_field(time: Timestamp) -> usize {
    let micros = time.as_unix_micros();
    delimited(
        int_field(micros.div_euclid(1_000_000)) + int_field(micros.rem_euclid(1_000_000) * 1000),
    )
}

/// `ListOutstandingLeasesResponse` without its leases: `next_cursor` and `server_time`.
const LEASES_RESPONSE_FIXED_LEN: usize = delimited(LEASE_ID_LEN) + TIMESTAMP;
/// The longest `next_page_token` the front end writes (`topology_claims_proto::page_token` holds
/// its codec to it): the response budget counts it.
pub const PAGE_TOKEN_MAX_LEN: usize = 480;
/// `ListClaimsResponse` without its claims: the ranges, `next_cursor`, `next_cursor_key` and
/// `next_page_token`.
const CLAIMS_RESPONSE_FIXED_LEN: usize = 3 * SCALAR
    + delimited(
        ENUM + delimited(MAX_VALUE_LEN) + delimited(super::namespaces::MAX_NAMESPACE_ID_LEN),
    )
    + delimited(PAGE_TOKEN_MAX_LEN);

/// `ClaimRecord` / `ClaimInfo`: claim type, owner type and table name (as enums and as names),
/// record id, the namespace, the value as sent, and the owner value; the key as well where it is
/// written (a `ClaimInfo` always carries it, a `ClaimRecord` when it differs from the value as
/// sent).
fn claim_record_len_bound(record: &ClaimRecord, with_key: bool) -> usize {
    3 * ENUM
        + delimited(record.owner_type.name().len())
        + delimited(record.table_name.name().len())
        + int_field(record.table_record_id)
        + delimited(record.key.namespace.as_str().len())
        + delimited(record.display_value().len())
        + if with_key || record.display.is_some() {
            delimited(record.key.value.len())
        } else {
            0
        }
        + delimited(record.owner_value.len())
}

/// An upper bound of the bytes one lease adds to a `ListOutstandingLeasesResponse`: the
/// `OutstandingLease` element (`LeasePayload` with the original `BeginUpdateRequest`, and
/// `last_renewed_at`). Fields proto3 leaves out (zeros, an empty lease id) are counted anyway.
pub fn lease_encoded_len_bound(lease: &Lease) -> usize {
    let request = &lease.request;
    let request_len = delimited(request.cell_id.as_str().len())
        + delimited(LEASE_ID_LEN)
        + request
            .operations()
            .map(|(_, record)| delimited(claim_record_len_bound(record, false)))
            .sum::<usize>()
        + request
            .local_transaction
            .as_ref()
            .map_or(0, |t| delimited(t.as_str().len()));
    let payload_len = delimited(LEASE_ID_LEN)
        + delimited(lease.cell_id.as_str().len())
        + timestamp_field(lease.created_at)
        + delimited(request_len);
    delimited(delimited(payload_len) + timestamp_field(lease.last_renewed_at))
}

/// An upper bound of the bytes one claim adds to a `ListClaimsResponse`: the `ClaimInfo`
/// element (the record's fields, state, `created_at`, `updated_at` and `revision`).
pub fn claim_encoded_len_bound(claim: &Claim) -> usize {
    delimited(
        claim_record_len_bound(&claim.record, true)
            + ENUM
            + timestamp_field(claim.created_at)
            + timestamp_field(claim.updated_at)
            + SCALAR,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::types::{BeginUpdate, ClaimKey, ClaimType, OwnerType};

    fn claim(id: i64, value: &str) -> Claim {
        Claim {
            record: ClaimRecord {
                display: None,
                key: ClaimKey::new(ClaimType::Username, value),
                owner_type: OwnerType::USER,
                owner_value: "o".into(),
                table_name: TableName::USERS,
                table_record_id: id,
            },
            cell_id: CellId::parse("c").unwrap(),
            lease: None,
            created_at: Timestamp::default(),
            updated_at: Timestamp::default(),
            revision: 0,
        }
    }

    fn query(cursor: ClaimsCursor, limit: usize, max_bytes: usize) -> ClaimsQuery {
        ClaimsQuery {
            cell_id: CellId::parse("c").unwrap(),
            table_name: TableName::USERS,
            cursor,
            limit,
            max_bytes,
        }
    }

    /// A store of `claims` (in page order): the rows a page request reads.
    fn rows(claims: &[Claim], query: &ClaimsQuery) -> Vec<Claim> {
        let (id, claim_type, value) = query.cursor.start_after();
        claims
            .iter()
            .filter(|c| {
                let key = &c.record.key;
                (
                    c.record.table_record_id,
                    key.namespace_number(),
                    key.value.as_str(),
                ) > (id, claim_type, value)
            })
            .take(query.fetch_limit())
            .cloned()
            .collect()
    }

    fn values(page: &ClaimsPage) -> Vec<&str> {
        page.claims.iter().map(|c| c.key().value.as_str()).collect()
    }

    #[test]
    fn a_page_holds_at_most_limit_claims_and_ends_between_records() {
        let all = [claim(1, "a"), claim(1, "b"), claim(4, "c"), claim(7, "d")];
        let q = query(ClaimsCursor::at(0), 3, usize::MAX);
        let page = claims_page(&q, rows(&all, &q));
        assert_eq!(values(&page), ["a", "b", "c"]);
        assert_eq!((page.start_range, page.end_range), (0, 7));
        assert_eq!(page.next_cursor, Some(ClaimsCursor::at(7)));
    }

    #[test]
    fn a_page_that_would_end_inside_a_record_is_cut_back_to_its_start() {
        let all = [claim(1, "a"), claim(4, "b"), claim(4, "c"), claim(4, "d")];
        let q = query(ClaimsCursor::at(0), 3, usize::MAX);
        let page = claims_page(&q, rows(&all, &q));
        assert_eq!(values(&page), ["a"]);
        assert_eq!(page.end_range, 4);
        assert_eq!(page.next_cursor, Some(ClaimsCursor::at(4)));
    }

    #[test]
    fn a_record_that_alone_fills_a_page_is_split_with_a_key_cursor() {
        let all = [claim(4, "a"), claim(4, "b"), claim(4, "c"), claim(9, "d")];
        let q = query(ClaimsCursor::at(2), 2, usize::MAX);
        let first = claims_page(&q, rows(&all, &q));
        assert_eq!(values(&first), ["a", "b"]);
        assert_eq!((first.start_range, first.end_range), (2, 4));
        let cursor = first.next_cursor.clone().unwrap();
        assert_eq!(
            cursor,
            ClaimsCursor {
                record_id: 4,
                after_key: Some(ClaimKey::new(ClaimType::Username, "b")),
            }
        );
        let q = query(cursor, 2, usize::MAX);
        let second = claims_page(&q, rows(&all, &q));
        assert_eq!(values(&second), ["c", "d"]);
        assert_eq!((second.start_range, second.end_range), (4, i64::MAX));
        assert_eq!(second.next_cursor, None);
    }

    #[test]
    fn a_page_ending_inside_a_record_is_refused_to_a_client_that_resumes_only_at_record_ids() {
        let all = [claim(1, "a"), claim(4, "b"), claim(4, "c"), claim(4, "d")];
        let q = query(ClaimsCursor::at(0), 2, usize::MAX);
        let page = claims_page(&q, rows(&all, &q));
        assert_eq!(page.split_record(), None, "ends between records 1 and 4");
        assert_eq!(check_claims_page_followable(&q, &page, false), Ok(()));

        let q = query(ClaimsCursor::at(4), 2, usize::MAX);
        let page = claims_page(&q, rows(&all, &q));
        assert_eq!(
            check_claims_page_followable(&q, &page, false),
            Err(ClaimsError::RecordExceedsPage {
                table_name: TableName::USERS,
                record_id: 4,
            })
        );
        assert_eq!(check_claims_page_followable(&q, &page, true), Ok(()));
    }

    #[test]
    fn a_claims_page_stops_before_its_byte_budget_with_at_least_one_claim() {
        let all: Vec<Claim> = (0..10).map(|i| claim(i, &format!("v{i}"))).collect();
        let one = claim_encoded_len_bound(&all[0]);
        let q = query(
            ClaimsCursor::at(0),
            100,
            CLAIMS_RESPONSE_FIXED_LEN + 3 * one + one / 2,
        );
        let page = claims_page(&q, rows(&all, &q));
        assert_eq!(values(&page), ["v0", "v1", "v2"]);
        assert_eq!(page.next_cursor, Some(ClaimsCursor::at(3)));
        let q = query(ClaimsCursor::at(0), 100, 1);
        assert_eq!(values(&claims_page(&q, rows(&all, &q))), ["v0"]);
    }

    #[test]
    fn the_last_page_reaches_the_end_of_the_id_space() {
        let q = query(ClaimsCursor::at(5), 10, usize::MAX);
        let page = claims_page(&q, Vec::new());
        assert_eq!(
            (page.start_range, page.end_range, page.next_cursor),
            (5, i64::MAX, None)
        );
    }

    fn lease(n: u128, claims: usize) -> Lease {
        let cell_id = CellId::parse("c").unwrap();
        Lease {
            lease_id: LeaseId::from_uuid(uuid::Uuid::from_u128(n)),
            cell_id: cell_id.clone(),
            created_at: Timestamp::default(),
            last_renewed_at: Timestamp::default(),
            request: BeginUpdate {
                local_transaction: None,
                cell_id,
                lease_id: None,
                creates: (0..claims)
                    .map(|i| claim(1, &format!("l{n}-{i}")).record)
                    .collect(),
                destroys: Vec::new(),
                updates: Vec::new(),
            },
        }
    }

    fn leases_query(limit: usize, max_bytes: usize) -> LeasesQuery {
        LeasesQuery {
            cell_id: CellId::parse("c").unwrap(),
            after: None,
            limit,
            max_bytes,
        }
    }

    #[test]
    fn a_leases_page_stops_before_its_byte_budget_and_continues_after_its_last_lease() {
        let leases: Vec<Lease> = (1..=5).map(|n| lease(n, 10)).collect();
        let one = lease_encoded_len_bound(&leases[0]);
        let budget = LEASES_RESPONSE_FIXED_LEN + 2 * one + one / 2;
        let page = leases_page(
            &leases_query(100, budget),
            leases.clone(),
            Timestamp::default(),
        );
        assert_eq!(page.leases, leases[..2]);
        assert_eq!(page.next_cursor, Some(leases[1].lease_id));
        let page = leases_page(&leases_query(100, 1), leases.clone(), Timestamp::default());
        assert_eq!(
            page.leases,
            leases[..1],
            "at least one lease, however large"
        );
        let page = leases_page(
            &leases_query(4, usize::MAX),
            leases.clone(),
            Timestamp::default(),
        );
        assert_eq!(
            (page.leases.len(), page.next_cursor),
            (4, Some(leases[3].lease_id))
        );
        let page = leases_page(&leases_query(5, usize::MAX), leases, Timestamp::default());
        assert_eq!((page.leases.len(), page.next_cursor), (5, None));
    }

    /// The leases of `all` after `query.after`, as a store reads them for `query`.
    fn read(all: &[Lease], query: &LeasesQuery) -> LeasesPage {
        let rows = all
            .iter()
            .filter(|l| query.after.is_none_or(|after| l.lease_id > after))
            .take(query.fetch_limit())
            .cloned()
            .collect();
        leases_page(query, rows, Timestamp::default())
    }

    fn built(all: &[Lease], query: &LeasesQuery) -> (LeasesPage, usize) {
        let mut builder = LeasesPageBuilder::new(query);
        let mut reads = 0;
        loop {
            let next = builder.next_read();
            assert!(next.limit <= LEASES_READ_CHUNK);
            reads += 1;
            if let Some(page) = builder.take(read(all, &next)) {
                return (page, reads);
            }
        }
    }

    #[test]
    fn a_leases_page_built_from_chunks_reads_a_chunk_at_a_time() {
        let leases: Vec<Lease> = (1..=40).map(|n| lease(n, 2)).collect();
        let query = leases_query(100, usize::MAX);
        let (page, reads) = built(&leases, &query);
        assert_eq!(page, read(&leases, &query));
        assert_eq!((page.leases.len(), page.next_cursor, reads), (40, None, 3));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Random lease sizes, limits, budgets and cursors: the page built from chunked
            /// reads is exactly the page of one read.
            #[test]
            fn chunked_reads_build_the_same_leases_page(
                sizes in proptest::collection::vec(0usize..40, 0..60),
                limit in 1usize..70,
                budget_leases in 0usize..30,
                start in 0usize..5,
            ) {
                let leases: Vec<Lease> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| lease(i as u128 + 1, *n))
                    .collect();
                let unit = lease_encoded_len_bound(&lease(1, 10));
                let mut query = leases_query(limit, LEASES_RESPONSE_FIXED_LEN + budget_leases * unit);
                query.after = leases.get(start).map(|l| l.lease_id);
                prop_assert_eq!(built(&leases, &query).0, read(&leases, &query));
            }
        }

        proptest! {
            /// Random records with 1..=6 claims each, random limits and budgets: paging from
            /// cursor 0 returns every claim once in order, the ranges tile the id space, every
            /// claim lies in its page's range (or is one of the first claims of record
            /// `end_range` on a page that ended inside it), and no page exceeds its limit or,
            /// unless it holds a single claim, its budget.
            #[test]
            fn pages_tile_the_id_space_and_return_every_claim_once(
                records in prop::collection::btree_map(0i64..40, 1usize..7, 0..12),
                steps in prop::collection::vec((1usize..5, 0usize..4), 1..5),
            ) {
                let all: Vec<Claim> = records
                    .iter()
                    .flat_map(|(&id, &n)| (0..n).map(move |i| claim(id, &format!("r{id}-{i}"))))
                    .collect();
                let one = claim_encoded_len_bound(&all.first().cloned().unwrap_or_else(|| claim(0, "r0-0")));
                let mut cursor = ClaimsCursor::at(0);
                let mut listed = Vec::new();
                for step in 0.. {
                    prop_assert!(step <= all.len(), "paging advances");
                    let (limit, budget_claims) = steps[step % steps.len()];
                    let budget = if budget_claims == 0 {
                        usize::MAX
                    } else {
                        CLAIMS_RESPONSE_FIXED_LEN + budget_claims * one
                    };
                    let q = query(cursor.clone(), limit, budget);
                    let page = claims_page(&q, rows(&all, &q));
                    prop_assert_eq!(page.start_range, cursor.record_id);
                    prop_assert!(page.claims.len() <= limit);
                    prop_assert!(page.claims.len() <= 1 || page.claims.len() <= budget_claims || budget_claims == 0);
                    for c in &page.claims {
                        let id = c.record.table_record_id;
                        prop_assert!(
                            (page.start_range..page.end_range).contains(&id)
                                || page.split_record() == Some(id)
                        );
                    }
                    listed.extend(page.claims.iter().cloned());
                    match page.next_cursor {
                        Some(next) => {
                            prop_assert_eq!(next.record_id, page.end_range);
                            prop_assert!(!page.claims.is_empty());
                            cursor = next;
                        }
                        None => {
                            prop_assert_eq!(page.end_range, i64::MAX);
                            break;
                        }
                    }
                }
                prop_assert_eq!(listed, all);
            }
        }
    }
}
