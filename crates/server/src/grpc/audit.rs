//! The audit log (`serve --audit-log PATH`): one JSON object per line for every mutating RPC
//! (BeginUpdate, CommitUpdate, RollbackUpdate, RenewLease), every WatchClaims stream as it opens
//! (never its events), and every authentication or authorization refusal, written by the
//! authorization layer once the answer is known; and for
//! every AdminService call a line *before* it acts (`stage` `intent`, synced to disk; the call is
//! refused with UNAVAILABLE `AUDIT_UNAVAILABLE` when that line cannot be written) and, for
//! ForceRollback and DecommissionCell, one after (`stage` `done`), with `admin_reason`,
//! `dry_run` and `older_than_seconds`.
//!
//! Fields: `time` (RFC 3339, UTC), `peer`, `identity` (the SPIFFE id, `cn:NAME`, or `anonymous`
//! on a plaintext server), `role`, `method`, `cell_id`, `lease_id`, `claim_count` (claims the
//! request carried), `claims` (each with its `op`, `namespace`, `claim_value`; every claim of an
//! accepted request, at most [`REFUSED_CLAIMS_LOGGED`] of a refused one), `code` (the gRPC code
//! name), `reason` (the ErrorInfo reason, or empty) and `duration_ms`. Claim values can be
//! personal data (emails): with `--audit-hash-key-file`, each is written as `hmac-sha256:HEX`
//! under that key instead, so equal values still match across lines without being readable.
//!
//! Every line is bounded whatever the request said: each text field is cut to a fixed number of
//! bytes (`FIELD_LIMITS`, marked `…[cut N bytes]`), so the worst case is a number
//! (docs/security.md, "Audit log").
//!
//! Lines are written by one thread of their own, fed through a queue bounded in bytes
//! (`--audit-queue-bytes`): a request never waits for the disk. When the queue is full the line
//! is dropped, counted (`dropped`, the metric `topology_claims_audit_lines_dropped_total`) and
//! logged (at most every few seconds). An admin intent line instead waits for room and for its
//! `fsync`. `reopen` (SIGHUP) opens the path again, as logrotate expects after moving the file.
//! A write that fails is counted and logged; it never fails the request (admin intents aside).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};

use topology_claims::error::ClaimsError;
use topology_claims_proto::log::RateLimitedLog;

/// Claims listed in the line of a refused request (its `claim_count` still counts them all).
pub const REFUSED_CLAIMS_LOGGED: usize = 16;

/// Default of `--audit-queue-bytes`: bytes of lines waiting for the writer thread.
pub const DEFAULT_QUEUE_BYTES: usize = 64 * 1024 * 1024;

/// The most bytes each text field of a line keeps (before JSON escaping): peer, identity, role,
/// method, cell_id, lease_id, namespace, claim_value, code, reason, admin_reason.
pub const FIELD_LIMITS: FieldLimits = FieldLimits {
    short: 128,
    identity: 512,
    claim_value: 256,
    admin_reason: 1024,
};

/// See [`FIELD_LIMITS`].
#[derive(Clone, Copy, Debug)]
pub struct FieldLimits {
    /// peer, role, method, cell_id, lease_id, namespace, code, reason.
    pub short: usize,
    pub identity: usize,
    pub claim_value: usize,
    pub admin_reason: usize,
}

/// One claim of an audited request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedClaim {
    pub op: &'static str,
    /// The namespace as sent (`namespace`, or the built-in a legacy `claim_type` names).
    pub namespace: String,
    pub claim_value: String,
}

/// One line of the audit log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuditRecord {
    pub peer: String,
    pub identity: String,
    pub role: String,
    pub method: String,
    pub cell_id: String,
    pub lease_id: String,
    /// Claims the request carried (`claims` may list fewer: a refused request lists at most
    /// [`REFUSED_CLAIMS_LOGGED`]).
    pub claim_count: usize,
    pub claims: Vec<AuditedClaim>,
    pub code: String,
    pub reason: String,
    pub duration_ms: f64,
    /// A BeginUpdate sent as a verifier's correction during a restore's quarantine
    /// (`restore_correction`): written as `"restore_correction":true`, absent otherwise.
    pub restore_correction: bool,
    /// What an AdminService call asked for; `None` for the claims API.
    pub admin: Option<AdminAudit>,
}

impl AuditRecord {
    /// Bytes of the record's text: what it holds in the queue, about its line's length.
    fn text_bytes(&self) -> usize {
        let claims: usize = self
            .claims
            .iter()
            .map(|c| c.namespace.len() + c.claim_value.len() + 64)
            .sum();
        let admin = self.admin.as_ref().map_or(0, |a| {
            let ids = |ids: &[String]| -> usize {
                ids.iter()
                    .take(ADMIN_IDS_LOGGED)
                    .map(|id| id.len() + 4)
                    .sum()
            };
            a.reason.len()
                + 128
                + a.backup_time.as_ref().map_or(0, String::len)
                + a.namespace_change.as_ref().map_or(0, String::len)
                + ids(&a.expect_cells)
                + ids(&a.lease_ids)
        });
        256 + self.peer.len()
            + self.identity.len()
            + self.role.len()
            + self.method.len()
            + self.cell_id.len()
            + self.lease_id.len()
            + self.code.len()
            + self.reason.len()
            + claims
            + admin
    }
}

/// The admin part of an audit line: written once before the call acts (`stage` `intent`,
/// without a code) and, for ForceRollback and DecommissionCell, once after (`done`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdminAudit {
    pub stage: &'static str,
    /// The operator's stated reason.
    pub reason: String,
    pub dry_run: bool,
    /// `older_than` of ListLeases / ForceRollback, in seconds.
    pub older_than_seconds: u64,
    /// MarkRestored: the backup time asked for (RFC 3339, or the raw value when impossible).
    pub backup_time: Option<String>,
    /// MarkRestored: the cells the epoch is to wait for, as asked (at most
    /// [`ADMIN_IDS_LOGGED`] listed).
    pub expect_cells: Vec<String>,
    /// LiftQuarantine: the epoch asked for; MarkRestored / LiftQuarantine `done`: the epoch
    /// the store is at after the call.
    pub epoch: Option<u64>,
    /// ForceRollback `done`: the leases rolled back (at most [`ADMIN_IDS_LOGGED`] listed) …
    pub lease_ids: Vec<String>,
    /// … and how many there were.
    pub lease_count: Option<u64>,
    /// ForceRollback / DecommissionCell `done`: the claims they released.
    pub claims: Option<u64>,
    /// UpdateNamespace: the namespace and what the call asks to change
    /// (`usernames: max_chars=32, deprecated=true`).
    pub namespace_change: Option<String>,
}

/// Ids an admin line lists (leases rolled back, cells expected); its counts count them all.
pub const ADMIN_IDS_LOGGED: usize = 100;

/// What the writer thread is asked to do.
enum Job {
    /// Append a line; nobody waits.
    Line(AuditRecord, SystemTime, usize),
    /// Append a line, flush and fsync it, then say how that went.
    Durable(AuditRecord, SystemTime, oneshot::Sender<Result<(), String>>),
    /// Answer once every job queued before this one is done.
    Barrier(std::sync::mpsc::Sender<()>),
}

/// How claim values are written (`serve --audit-claim-values`, docs/security.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimValues<'a> {
    /// As sent (cut to 256 bytes).
    Clear,
    /// As `hmac-sha256:HEX` under this key (at least 16 bytes): a known value can be searched
    /// for, no value can be read back.
    Hmac(&'a [u8]),
    /// Not at all: the line names the namespace and the operation only.
    Omit,
}

/// [`ClaimValues`] as the log keeps it.
enum Values {
    Clear,
    Hmac(Box<aws_lc_rs::hmac::Key>),
    Omit,
}

/// What the writer thread and the request side share.
struct Shared {
    path: PathBuf,
    file: Mutex<File>,
    values: Values,
    failures: Arc<AtomicU64>,
    failure_log: RateLimitedLog,
}

/// The open audit log.
pub struct AuditLog {
    shared: Arc<Shared>,
    queue: mpsc::UnboundedSender<Job>,
    /// Bytes of queued lines (their records' text), and their bound.
    queued: Arc<std::sync::atomic::AtomicUsize>,
    queue_bytes: usize,
    /// Writes that failed since start.
    pub failures: Arc<AtomicU64>,
    /// Lines dropped because the queue was full, since start.
    pub dropped: AtomicU64,
    dropped_log: RateLimitedLog,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("path", &self.shared.path)
            .field("hashed", &matches!(self.shared.values, Values::Hmac(_)))
            .finish()
    }
}

/// Opens `path` for appending, creating it readable and writable by its owner only (0600): its
/// lines name identities, peers and, unless omitted, claim values.
fn open(path: &Path) -> Result<File, String> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(path)
        .map_err(|e| format!("cannot open the audit log {}: {e}", path.display()))
}

impl AuditLog {
    /// Opens (appending, creating with mode 0600) `path` and starts its writer thread;
    /// `values`: how claim values are written; `queue_bytes`: bytes of lines that may wait for
    /// the writer (`--audit-queue-bytes`).
    pub fn open(
        path: &Path,
        values: ClaimValues<'_>,
        queue_bytes: usize,
    ) -> Result<Self, ClaimsError> {
        let file = open(path).map_err(|message| ClaimsError::Configuration { message })?;
        if matches!(values, ClaimValues::Hmac(key) if key.len() < 16) {
            return Err(ClaimsError::Configuration {
                message: "the audit hash key must be at least 16 bytes".into(),
            });
        }
        if queue_bytes < 64 * 1024 {
            return Err(ClaimsError::Configuration {
                message: "--audit-queue-bytes must be at least 64 KiB (one line of a refusal)"
                    .into(),
            });
        }
        let failures = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(Shared {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            values: match values {
                ClaimValues::Clear => Values::Clear,
                ClaimValues::Hmac(key) => Values::Hmac(Box::new(aws_lc_rs::hmac::Key::new(
                    aws_lc_rs::hmac::HMAC_SHA256,
                    key,
                ))),
                ClaimValues::Omit => Values::Omit,
            },
            failures: Arc::clone(&failures),
            failure_log: RateLimitedLog::default(),
        });
        let (queue, mut jobs) = mpsc::unbounded_channel();
        let writer = Arc::clone(&shared);
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let dequeued = Arc::clone(&queued);
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                // Ends when the log (every sender) is dropped and the queue is drained.
                while let Some(job) = jobs.blocking_recv() {
                    match job {
                        Job::Line(record, at, bytes) => {
                            let _ = writer.append(&record, at, false);
                            dequeued.fetch_sub(bytes, Ordering::Relaxed);
                        }
                        Job::Durable(record, at, done) => {
                            let _ = done.send(writer.append(&record, at, true));
                        }
                        Job::Barrier(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .map_err(|e| ClaimsError::Configuration {
                message: format!("cannot start the audit log writer thread: {e}"),
            })?;
        Ok(Self {
            shared,
            queue,
            queued,
            queue_bytes,
            failures,
            dropped: AtomicU64::new(0),
            dropped_log: RateLimitedLog::default(),
        })
    }

    /// Opens the path again (after logrotate moved the file); keeps the old file on failure.
    pub fn reopen(&self) -> Result<(), String> {
        let file = open(&self.shared.path)?;
        *self.shared.file.lock().unwrap_or_else(|p| p.into_inner()) = file;
        Ok(())
    }

    /// Queues `record` as one line and returns at once. When the queue is full the line is
    /// dropped, counted and logged: a request never waits for the audit log.
    pub fn write(&self, record: AuditRecord) {
        let bytes = record.text_bytes();
        let admitted = self
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |queued| {
                (queued + bytes <= self.queue_bytes).then_some(queued + bytes)
            })
            .is_ok();
        if !admitted {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(held_back) = self.dropped_log.ready() {
                tracing::error!(dropped, held_back, method = %record.method,
                    identity = %record.identity, path = %self.shared.path.display(),
                    "audit log queue full (--audit-queue-bytes): line dropped; the request \
                     itself was not affected");
            }
            return;
        }
        if self
            .queue
            .send(Job::Line(record, SystemTime::now(), bytes))
            .is_err()
        {
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Appends `record` as one line, flushed and synced to disk, or says why it could not
    /// (counted and logged as by [`write`](Self::write)): waits for the lines queued before it
    /// and for its own. Admin calls act only after this succeeded.
    pub async fn write_durable(&self, record: AuditRecord) -> Result<(), String> {
        let (done, written) = oneshot::channel();
        let cannot = || {
            format!(
                "cannot write the audit log {}: its writer thread is gone",
                self.shared.path.display()
            )
        };
        self.queue
            .send(Job::Durable(record, SystemTime::now(), done))
            .map_err(|_| cannot())?;
        written.await.map_err(|_| cannot())?
    }

    /// Waits (blocking the thread) until every line queued so far has been handled. For tests
    /// and shutdown; never call it on an async worker.
    pub fn flush_blocking(&self) {
        let (done, finished) = std::sync::mpsc::channel();
        if self.queue.send(Job::Barrier(done)).is_ok() {
            let _ = finished.recv();
        }
    }

    /// At exit: writes every line queued so far and syncs the file, so that no request answered
    /// before the shutdown loses its line. Blocking, like [`flush_blocking`](Self::flush_blocking).
    pub fn close_blocking(&self) {
        self.flush_blocking();
        let file = self.shared.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(error) = file.sync_data() {
            tracing::error!(%error, path = %self.shared.path.display(),
                "syncing the audit log at exit failed");
        }
    }

    #[cfg(test)]
    fn line(&self, r: &AuditRecord, now: SystemTime) -> String {
        self.shared.line(r, now)
    }
}

impl Shared {
    /// Appends one line (and with `sync`, fsyncs it); a failure is counted and logged.
    fn append(&self, record: &AuditRecord, at: SystemTime, sync: bool) -> Result<(), String> {
        let mut line = self.line(record, at);
        line.push('\n');
        let written = {
            let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
            file.write_all(line.as_bytes())
                .and_then(|()| file.flush())
                .and_then(|()| if sync { file.sync_data() } else { Ok(()) })
        };
        if let Err(error) = written {
            let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(held_back) = self.failure_log.ready() {
                tracing::error!(%error, failures, held_back, path = %self.path.display(),
                    "audit log write failed; the request itself was not affected");
            }
            return Err(format!(
                "cannot write the audit log {}: {error}",
                self.path.display()
            ));
        }
        Ok(())
    }

    /// The `claim_value` as written; `None` when values are omitted.
    fn value(&self, value: &str) -> Option<String> {
        match &self.values {
            Values::Hmac(key) => {
                let tag = aws_lc_rs::hmac::sign(key, value.as_bytes());
                let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
                Some(format!("hmac-sha256:{hex}"))
            }
            Values::Clear => Some(cut(value, FIELD_LIMITS.claim_value)),
            Values::Omit => None,
        }
    }

    fn line(&self, r: &AuditRecord, now: SystemTime) -> String {
        let short = |text: &str| json(&cut(text, FIELD_LIMITS.short));
        let claims: Vec<String> = r
            .claims
            .iter()
            .map(|c| {
                let value = self
                    .value(&c.claim_value)
                    .map(|v| format!(",\"claim_value\":{}", json(&v)))
                    .unwrap_or_default();
                format!(
                    "{{\"op\":{},\"namespace\":{}{value}}}",
                    json(c.op),
                    short(&c.namespace),
                )
            })
            .collect();
        let admin = r.admin.as_ref().map_or_else(String::new, |a| {
            let ids = |ids: &[String]| {
                let listed: Vec<String> = ids
                    .iter()
                    .take(ADMIN_IDS_LOGGED)
                    .map(|id| short(id))
                    .collect();
                listed.join(",")
            };
            let mut text = format!(
                ",\"stage\":{},\"admin_reason\":{},\"dry_run\":{},\"older_than_seconds\":{}",
                json(a.stage),
                json(&cut(&a.reason, FIELD_LIMITS.admin_reason)),
                a.dry_run,
                a.older_than_seconds
            );
            if let Some(backup_time) = &a.backup_time {
                text.push_str(&format!(
                    ",\"backup_time\":{},\"expect_cells\":[{}]",
                    short(backup_time),
                    ids(&a.expect_cells)
                ));
            }
            if let Some(epoch) = a.epoch {
                text.push_str(&format!(",\"epoch\":{epoch}"));
            }
            if let Some(count) = a.lease_count {
                text.push_str(&format!(
                    ",\"lease_count\":{count},\"lease_ids\":[{}]",
                    ids(&a.lease_ids)
                ));
            }
            if let Some(claims) = a.claims {
                text.push_str(&format!(",\"released_claims\":{claims}"));
            }
            if let Some(change) = &a.namespace_change {
                text.push_str(&format!(",\"namespace_change\":{}", short(change)));
            }
            text
        });
        format!(
            "{{\"time\":{},\"peer\":{},\"identity\":{},\"role\":{},\"method\":{},\"cell_id\":{},\
             \"lease_id\":{},\"claim_count\":{},\"claims\":[{}],\"code\":{},\"reason\":{},\
             \"duration_ms\":{:.3}{}{}}}",
            json(&rfc3339(now)),
            short(&r.peer),
            json(&cut(&r.identity, FIELD_LIMITS.identity)),
            short(&r.role),
            short(&r.method),
            short(&r.cell_id),
            short(&r.lease_id),
            r.claim_count.max(r.claims.len()),
            claims.join(","),
            short(&r.code),
            short(&r.reason),
            r.duration_ms,
            if r.restore_correction {
                ",\"restore_correction\":true"
            } else {
                ""
            },
            admin
        )
    }
}

/// `text` cut to at most `max` bytes at a character boundary, the cut marked with how many
/// bytes went.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[cut {} bytes]", &text[..end], text.len() - end)
}

/// A JSON string literal.
fn json(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || needs_escape(c) => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Characters written as `\uXXXX` although JSON allows them raw: DEL, the line and paragraph
/// separators (which end a line in JavaScript and in some log viewers) and the bidirectional
/// controls (which make a line read differently from what it holds, "Trojan Source").
fn needs_escape(c: char) -> bool {
    matches!(c,
        '\u{7f}'
        | '\u{061c}'
        | '\u{200e}' | '\u{200f}'
        | '\u{2028}' | '\u{2029}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}')
}

/// `2026-11-23T22:40:05.123Z`.
fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    rfc3339_of(since.as_secs() as i64, since.subsec_nanos())
}

/// A protobuf timestamp as RFC 3339, or its raw fields when it is none (out of range).
pub fn timestamp_text(t: &prost_types::Timestamp) -> String {
    // 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
    if (-62_135_596_800..=253_402_300_799).contains(&t.seconds)
        && (0..1_000_000_000).contains(&t.nanos)
    {
        rfc3339_of(t.seconds, t.nanos as u32)
    } else {
        format!("(seconds {}, nanos {})", t.seconds, t.nanos)
    }
}

fn rfc3339_of(secs: i64, nanos: u32) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        nanos / 1_000_000
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        let at = UNIX_EPOCH + Duration::from_millis(1_795_475_205_123);
        assert_eq!(rfc3339(at), "2026-11-23T23:06:45.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_write_is_counted_and_does_not_fail_the_caller() {
        // /dev/full opens fine and fails every write with ENOSPC.
        let log = AuditLog::open(
            Path::new("/dev/full"),
            ClaimValues::Clear,
            DEFAULT_QUEUE_BYTES,
        )
        .unwrap();
        log.write(AuditRecord::default());
        log.write(AuditRecord::default());
        log.flush_blocking();
        assert_eq!(log.failures.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn lines_are_json_and_values_can_be_hashed() {
        let dir = std::env::temp_dir().join(format!("audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let record = AuditRecord {
            method: "BeginUpdate".into(),
            claims: vec![AuditedClaim {
                op: "create",
                namespace: "emails".into(),
                claim_value: "a\"b@example.com".into(),
            }],
            code: "OK".into(),
            ..AuditRecord::default()
        };
        let plain = AuditLog::open(
            &dir.join("plain.log"),
            ClaimValues::Clear,
            DEFAULT_QUEUE_BYTES,
        )
        .unwrap();
        let line = plain.line(&record, UNIX_EPOCH);
        assert!(
            line.contains(r#""claim_value":"a\"b@example.com""#),
            "{line}"
        );
        let hashed = AuditLog::open(
            &dir.join("hashed.log"),
            ClaimValues::Hmac(b"0123456789abcdef"),
            DEFAULT_QUEUE_BYTES,
        )
        .unwrap();
        let line = hashed.line(&record, UNIX_EPOCH);
        assert!(line.contains("hmac-sha256:"), "{line}");
        assert!(!line.contains("example.com"), "{line}");
        assert_eq!(
            hashed.shared.value("x"),
            hashed.shared.value("x"),
            "equal values, equal hashes"
        );
        assert!(AuditLog::open(
            &dir.join("short.log"),
            ClaimValues::Hmac(b"short"),
            DEFAULT_QUEUE_BYTES
        )
        .is_err());
        let omitted = AuditLog::open(
            &dir.join("omit.log"),
            ClaimValues::Omit,
            DEFAULT_QUEUE_BYTES,
        )
        .unwrap();
        let line = omitted.line(&record, UNIX_EPOCH);
        assert!(line.contains(r#""namespace":"emails""#), "{line}");
        assert!(
            !line.contains("claim_value") && !line.contains("example.com"),
            "{line}"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("omit.log"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "created readable by its owner only");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn every_field_is_cut_so_a_line_has_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(
            &dir.path().join("a.log"),
            ClaimValues::Clear,
            DEFAULT_QUEUE_BYTES,
        )
        .unwrap();
        let huge = "é".repeat(1 << 20);
        let record = AuditRecord {
            peer: huge.clone(),
            identity: huge.clone(),
            role: huge.clone(),
            method: huge.clone(),
            cell_id: huge.clone(),
            lease_id: huge.clone(),
            claim_count: 2_000_000,
            claims: vec![
                AuditedClaim {
                    op: "create",
                    namespace: huge.clone(),
                    claim_value: huge.clone(),
                };
                REFUSED_CLAIMS_LOGGED
            ],
            code: huge.clone(),
            reason: huge.clone(),
            duration_ms: 1.0,
            restore_correction: true,
            admin: Some(AdminAudit {
                stage: "intent",
                reason: huge.clone(),
                backup_time: Some(huge.clone()),
                expect_cells: vec!["c".repeat(1000); 10_000],
                epoch: Some(7),
                lease_ids: vec!["l".repeat(1000); 10_000],
                lease_count: Some(10_000),
                claims: Some(3),
                ..AdminAudit::default()
            }),
        };
        let line = log.line(&record, UNIX_EPOCH);
        assert!(line.len() < 64 * 1024, "{} bytes", line.len());
        assert!(line.contains("\"lease_count\":10000"), "{line}");
        assert!(line.contains("\"epoch\":7"), "{line}");
        assert!(line.contains("\"restore_correction\":true"), "{line}");
        assert!(line.contains("\"claim_count\":2000000"), "{line}");
        assert!(line.contains("…[cut "), "{line}");
    }

    #[test]
    fn separators_and_bidi_controls_are_escaped() {
        let text = "a\u{2028}b\u{2029}c\u{202e}d\u{2066}e\u{200f}f\u{7f}g\u{1}h é";
        assert_eq!(
            json(text),
            "\"a\\u2028b\\u2029c\\u202ed\\u2066e\\u200ff\\u007fg\\u0001h é\""
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let log = AuditLog::open(&path, ClaimValues::Clear, 64 * 1024).unwrap();
        // Hold the file so the writer thread blocks on its first line; the queue (64 KiB) fills
        // with the lines of ten 10 KB reasons.
        let held = log.shared.file.lock().unwrap();
        let record = AuditRecord {
            reason: "r".repeat(10_000),
            ..AuditRecord::default()
        };
        for _ in 0..10 {
            log.write(record.clone());
        }
        drop(held);
        log.flush_blocking();
        let dropped = log.dropped.load(Ordering::Relaxed);
        let written = std::fs::read_to_string(&path).unwrap().lines().count() as u64;
        assert!((3..=4).contains(&dropped), "dropped {dropped}");
        assert_eq!(written + dropped, 10);
    }
}
