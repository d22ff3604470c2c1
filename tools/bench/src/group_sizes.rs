//! The batch sizes the server's combiner actually formed: its Prometheus histogram
//! `topology_claims_group_commit_batch_size`, scraped from a `serve --metrics-listen` child before
//! and after a measured phase (one plain HTTP/1.1 GET over a `TcpStream`: no HTTP client in the
//! tree for this), and the difference of the two.
//!
//! Owns scraping, parsing and arithmetic of that one histogram; no reporting layout.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The histogram the combiner observes once per store transaction it runs.
pub const METRIC: &str = "topology_claims_group_commit_batch_size";
/// Longest a scrape may take (a guard against a hung server, not a speed assertion).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a `/metrics` answer read.
const MAX_BODY: u64 = 4 * 1024 * 1024;

/// A snapshot (cumulative) or a difference of snapshots of the histogram.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupSizes {
    /// `(le, cumulative count)` in ascending `le` order; the last is `+Inf`.
    pub buckets: Vec<(f64, u64)>,
    /// Calls carried by all groups.
    pub sum: f64,
    /// Groups (store transactions).
    pub count: u64,
}

impl GroupSizes {
    /// The histogram in a Prometheus text exposition, `None` when the server does not export it
    /// (a binary from before group commit).
    pub fn parse(text: &str) -> Option<GroupSizes> {
        let bucket_prefix = format!("{METRIC}_bucket{{");
        let mut sizes = GroupSizes::default();
        let mut seen = false;
        for line in text.lines() {
            let (name, value) = match line.rsplit_once(' ') {
                Some(pair) if !line.starts_with('#') => pair,
                _ => continue,
            };
            if let Some(labels) = name.strip_prefix(&bucket_prefix) {
                let le = labels
                    .split(',')
                    .find_map(|label| label.trim().strip_prefix("le=\""))
                    .and_then(|le| le.strip_suffix("\"}").or_else(|| le.strip_suffix('"')))?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                sizes.buckets.push((le, value.parse::<f64>().ok()? as u64));
                seen = true;
            } else if name == format!("{METRIC}_sum") {
                sizes.sum = value.parse().ok()?;
                seen = true;
            } else if name == format!("{METRIC}_count") {
                sizes.count = value.parse::<f64>().ok()? as u64;
                seen = true;
            }
        }
        sizes.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        seen.then_some(sizes)
    }

    /// What happened between `before` and `self` (a counter reset counts from zero).
    pub fn since(&self, before: &GroupSizes) -> GroupSizes {
        let earlier = |le: f64| {
            before
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0, |(_, n)| *n)
        };
        GroupSizes {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, n)| (le, n.saturating_sub(earlier(le))))
                .collect(),
            sum: (self.sum - before.sum).max(0.0),
            count: self.count.saturating_sub(before.count),
        }
    }

    /// Adds another difference (another round of the same row).
    pub fn add(&mut self, other: &GroupSizes) {
        for &(le, n) in &other.buckets {
            match self.buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, mine)) => *mine += n,
                None => self.buckets.push((le, n)),
            }
        }
        self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.sum += other.sum;
        self.count += other.count;
    }

    /// Calls per group (0 when no group formed).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    /// Groups per size range, not cumulative: `("1", n)`, `("2", n)`, `("3-4", n)`, …,
    /// `(">512", n)`; empty ranges included.
    pub fn ranges(&self) -> Vec<(String, u64)> {
        let mut out = Vec::with_capacity(self.buckets.len());
        let (mut below, mut previous_le) = (0u64, 0.0f64);
        for &(le, cumulative) in &self.buckets {
            let first = previous_le.floor() as u64 + 1;
            let name = if le.is_infinite() {
                format!(">{previous_le}")
            } else if first as f64 >= le {
                format!("{le}")
            } else {
                format!("{first}-{le}")
            };
            out.push((name, cumulative.saturating_sub(below)));
            below = cumulative;
            previous_le = le;
        }
        out
    }

    /// `1: 12 · 2: 30 · 3-4: 7` (non-empty ranges only; `–` when no group formed).
    pub fn distribution(&self) -> String {
        let parts: Vec<String> = self
            .ranges()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(range, n)| format!("{range}: {n}"))
            .collect();
        if parts.is_empty() {
            "–".to_owned()
        } else {
            parts.join(" · ")
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "groups": self.count,
            "calls": self.sum,
            "mean_size": self.mean(),
            "distribution": self.ranges().into_iter()
                .map(|(size, groups)| json!({ "size": size, "groups": groups }))
                .collect::<Vec<_>>(),
        })
    }
}

/// Scrapes `http://addr/metrics` and returns the histogram (`Ok(None)`: not exported).
pub async fn scrape(addr: SocketAddr) -> Result<Option<GroupSizes>, String> {
    let body = tokio::time::timeout(SCRAPE_TIMEOUT, get_metrics(addr))
        .await
        .map_err(|_| format!("http://{addr}/metrics gave no answer within {SCRAPE_TIMEOUT:?}"))??;
    Ok(GroupSizes::parse(&body))
}

async fn get_metrics(addr: SocketAddr) -> Result<String, String> {
    let failed = |e: std::io::Error| format!("scraping http://{addr}/metrics: {e}");
    let mut stream = TcpStream::connect(addr).await.map_err(failed)?;
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.map_err(failed)?;
    let mut response = Vec::new();
    stream
        .take(MAX_BODY)
        .read_to_end(&mut response)
        .await
        .map_err(failed)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("http://{addr}/metrics: not an HTTP response"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(format!("http://{addr}/metrics answered {status:?}"));
    }
    if head
        .lines()
        .any(|h| h.to_ascii_lowercase().starts_with("transfer-encoding:") && h.contains("chunked"))
    {
        return Ok(unchunk(body));
    }
    Ok(body.to_owned())
}

/// The payload of a `Transfer-Encoding: chunked` body.
fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size =
            usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(buckets: &[(&str, u64)], sum: f64, count: u64) -> String {
        let mut text = format!("# HELP {METRIC} calls per group\n# TYPE {METRIC} histogram\n");
        for (le, n) in buckets {
            text.push_str(&format!("{METRIC}_bucket{{le=\"{le}\"}} {n}\n"));
        }
        text.push_str(&format!("{METRIC}_sum {sum}\n{METRIC}_count {count}\n"));
        text.push_str("topology_claims_other_total 5\n");
        text
    }

    #[test]
    fn the_difference_of_two_scrapes_is_the_groups_formed_in_between() {
        let before = GroupSizes::parse(&exposition(
            &[("1", 10), ("2", 10), ("4", 12), ("+Inf", 12)],
            18.0,
            12,
        ))
        .unwrap();
        let after = GroupSizes::parse(&exposition(
            &[("1", 15), ("2", 25), ("4", 40), ("+Inf", 41)],
            130.0,
            41,
        ))
        .unwrap();
        let delta = after.since(&before);
        assert_eq!(delta.count, 29);
        assert_eq!(delta.sum, 112.0);
        assert_eq!(
            delta.ranges(),
            vec![
                ("1".to_owned(), 5),
                ("2".to_owned(), 10),
                ("3-4".to_owned(), 13),
                (">4".to_owned(), 1),
            ]
        );
        assert_eq!(delta.distribution(), "1: 5 · 2: 10 · 3-4: 13 · >4: 1");
        assert!((delta.mean() - 112.0 / 29.0).abs() < 1e-9);
    }

    #[test]
    fn rounds_add_up_and_an_idle_histogram_shows_no_groups() {
        let one = GroupSizes {
            buckets: vec![(1.0, 2), (f64::INFINITY, 2)],
            sum: 2.0,
            count: 2,
        };
        let mut total = GroupSizes::default();
        total.add(&one);
        total.add(&one);
        assert_eq!(total.count, 4);
        assert_eq!(total.buckets, vec![(1.0, 4), (f64::INFINITY, 4)]);
        assert_eq!(one.since(&one).distribution(), "–");
        assert_eq!(one.since(&one).mean(), 0.0);
    }

    #[test]
    fn a_server_without_the_histogram_gives_none() {
        assert_eq!(GroupSizes::parse("topology_claims_other_total 5\n"), None);
    }

    #[test]
    fn a_chunked_body_is_joined() {
        assert_eq!(
            unchunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
