//! What `/proc` (Linux) says about a process: CPU seconds and resident memory, for the bench's
//! per-process figures and for tests that prove a bound holds (memory under an attack, an
//! accept loop that does not spin). On systems without `/proc`, readings are `None` / 0.

use std::process::Command;

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`, 100 on Linux).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|ticks| *ticks > 0.0)
            .unwrap_or(100.0)
    })
}

/// The fields of `/proc/PID/stat` after the `(comm)` field, and the comm itself.
fn stat_fields(stat: &str) -> Option<(&str, Vec<&str>)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    Some((comm, stat.get(close + 1..)?.split_whitespace().collect()))
}

/// utime + stime (and, with `children`, cutime + cstime) of a `stat` line, in seconds.
fn stat_cpu(fields: &[&str], children: bool) -> f64 {
    // After the comm: state is index 0, utime 11, stime 12, cutime 13, cstime 14.
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let own = tick(11) + tick(12);
    let reaped = if children { tick(13) + tick(14) } else { 0.0 };
    (own + reaped) / clock_ticks()
}

/// CPU seconds a process has used so far (its own threads only).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = stat_fields(&stat)?;
    Some(stat_cpu(&fields, false))
}

/// CPU seconds of this benchmark process.
pub fn self_cpu_seconds() -> f64 {
    cpu_seconds(std::process::id()).unwrap_or(0.0)
}

/// CPU seconds of every process named `postgres`, including backends already reaped (counted in
/// the postmaster's cutime/cstime), so connections closed during a segment are not lost.
pub fn postgres_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .map(|stat| match stat_fields(&stat) {
            Some(("postgres", fields)) => stat_cpu(&fields, true),
            _ => 0.0,
        })
        .sum()
}

/// CPU seconds the whole machine spent busy (all cores: user, nice, system, irq, softirq,
/// steal), from the first line of `/proc/stat`.
pub fn machine_busy_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal …: everything but idle and iowait.
    let busy: f64 = [0usize, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    busy / clock_ticks()
}

/// Resident memory of a process (`VmRSS`), in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_spaces_in_the_name_parse() {
        let line = "42 (post gres) S 1 2 3 4 5 6 7 8 9 10 200 100 50 25 20 0";
        let (comm, fields) = stat_fields(line).unwrap();
        assert_eq!(comm, "post gres");
        let ticks = clock_ticks();
        assert!((stat_cpu(&fields, false) - 300.0 / ticks).abs() < 1e-9);
        assert!((stat_cpu(&fields, true) - 375.0 / ticks).abs() < 1e-9);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_a_resident_set() {
        assert!(rss_kib(std::process::id()).unwrap_or(0) > 0);
    }
}
