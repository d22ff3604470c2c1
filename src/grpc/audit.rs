//! The audit log (`serve --audit-log PATH`): one JSON object per line for every mutating RPC
//! (BeginUpdate, CommitUpdate, RollbackUpdate, RenewLease) and every authentication or
//! authorization refusal, written by the authorization layer after the answer is known; and for
//! every AdminService call a line *before* it acts (`stage` `intent`; the call is refused with
//! UNAVAILABLE `AUDIT_UNAVAILABLE` when that line cannot be written) and, for ForceRollback and
//! DecommissionCell, one after (`stage` `done`), with `admin_reason`, `dry_run` and
//! `older_than_seconds`.
//!
//! Fields: `time` (RFC 3339, UTC), `peer`, `identity` (the SPIFFE id, `cn:NAME`, or `anonymous`
//! on a plaintext server), `role`, `method`, `cell_id`, `lease_id`, `claims` (each with its
//! `op`, `claim_type`, `claim_value`), `code` (the gRPC code name), `reason` (the ErrorInfo
//! reason, or empty) and `duration_ms`. Claim values can be personal data (emails): with
//! `--audit-hash-key-file`, each is written as `hmac-sha256:HEX` under that key instead, so equal
//! values still match across lines without being readable.
//!
//! `reopen` (SIGHUP) opens the path again, as logrotate expects after moving the file. A write
//! that fails is counted and logged (at most every few seconds); it never fails the request.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::ClaimsError;
use crate::grpc::listener::RateLimitedLog;

/// One claim of an audited request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedClaim {
    pub op: &'static str,
    pub claim_type: String,
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
    pub claims: Vec<AuditedClaim>,
    pub code: String,
    pub reason: String,
    pub duration_ms: f64,
    /// What an AdminService call asked for; `None` for the claims API.
    pub admin: Option<AdminAudit>,
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
}

/// The open audit log.
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
    hash_key: Option<aws_lc_rs::hmac::Key>,
    /// Writes that failed since start.
    pub failures: AtomicU64,
    failure_log: RateLimitedLog,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("path", &self.path)
            .field("hashed", &self.hash_key.is_some())
            .finish()
    }
}

fn open(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open the audit log {}: {e}", path.display()))
}

impl AuditLog {
    /// Opens (appending, creating) `path`; `hash_key`: write claim values as keyed hashes.
    pub fn open(path: &Path, hash_key: Option<&[u8]>) -> Result<Self, ClaimsError> {
        let file = open(path).map_err(|message| ClaimsError::Configuration { message })?;
        if hash_key.is_some_and(|key| key.len() < 16) {
            return Err(ClaimsError::Configuration {
                message: "the audit hash key must be at least 16 bytes".into(),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            hash_key: hash_key
                .map(|key| aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key)),
            failures: AtomicU64::new(0),
            failure_log: RateLimitedLog::default(),
        })
    }

    /// Opens the path again (after logrotate moved the file); keeps the old file on failure.
    pub fn reopen(&self) -> Result<(), String> {
        let file = open(&self.path)?;
        *self.file.lock().unwrap_or_else(|p| p.into_inner()) = file;
        Ok(())
    }

    /// Appends `record` as one line; a failure is counted and logged, never returned.
    pub fn write(&self, record: &AuditRecord) {
        let _ = self.try_write(record);
    }

    /// Appends `record` as one line, flushed to the file, or says why it could not (counted
    /// and logged as by [`write`](Self::write)): admin calls are refused when this fails.
    pub fn try_write(&self, record: &AuditRecord) -> Result<(), String> {
        let mut line = self.line(record, SystemTime::now());
        line.push('\n');
        let written = {
            let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
            file.write_all(line.as_bytes()).and_then(|()| file.flush())
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

    fn value(&self, value: &str) -> String {
        match &self.hash_key {
            Some(key) => {
                let tag = aws_lc_rs::hmac::sign(key, value.as_bytes());
                let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
                format!("hmac-sha256:{hex}")
            }
            None => value.to_owned(),
        }
    }

    fn line(&self, r: &AuditRecord, now: SystemTime) -> String {
        let claims: Vec<String> = r
            .claims
            .iter()
            .map(|c| {
                format!(
                    "{{\"op\":{},\"claim_type\":{},\"claim_value\":{}}}",
                    json(c.op),
                    json(&c.claim_type),
                    json(&self.value(&c.claim_value))
                )
            })
            .collect();
        let admin = r.admin.as_ref().map_or_else(String::new, |a| {
            format!(
                ",\"stage\":{},\"admin_reason\":{},\"dry_run\":{},\"older_than_seconds\":{}",
                json(a.stage),
                json(&a.reason),
                a.dry_run,
                a.older_than_seconds
            )
        });
        format!(
            "{{\"time\":{},\"peer\":{},\"identity\":{},\"role\":{},\"method\":{},\"cell_id\":{},\
             \"lease_id\":{},\"claims\":[{}],\"code\":{},\"reason\":{},\"duration_ms\":{:.3}{}}}",
            json(&rfc3339(now)),
            json(&r.peer),
            json(&r.identity),
            json(&r.role),
            json(&r.method),
            json(&r.cell_id),
            json(&r.lease_id),
            claims.join(","),
            json(&r.code),
            json(&r.reason),
            r.duration_ms,
            admin
        )
    }
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
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `2026-11-23T22:40:05.123Z`.
fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
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
        since.subsec_millis()
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
        let log = AuditLog::open(Path::new("/dev/full"), None).unwrap();
        log.write(&AuditRecord::default());
        log.write(&AuditRecord::default());
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
                claim_type: "EMAIL".into(),
                claim_value: "a\"b@example.com".into(),
            }],
            code: "OK".into(),
            ..AuditRecord::default()
        };
        let plain = AuditLog::open(&dir.join("plain.log"), None).unwrap();
        let line = plain.line(&record, UNIX_EPOCH);
        assert!(
            line.contains(r#""claim_value":"a\"b@example.com""#),
            "{line}"
        );
        let hashed = AuditLog::open(&dir.join("hashed.log"), Some(b"0123456789abcdef")).unwrap();
        let line = hashed.line(&record, UNIX_EPOCH);
        assert!(line.contains("hmac-sha256:"), "{line}");
        assert!(!line.contains("example.com"), "{line}");
        assert_eq!(
            hashed.value("x"),
            hashed.value("x"),
            "equal values, equal hashes"
        );
        assert!(AuditLog::open(&dir.join("short.log"), Some(b"short")).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
