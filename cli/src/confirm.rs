//! The confirmation the destructive operator commands ask for (`admin force-rollback`,
//! `decommission`, `mark-restored`, `lift-quarantine`), and `--yes`. Not confirmed (no
//! terminal and no `--yes`, or an answer other than yes) is exit 1 with nothing changed.

use std::io::{BufRead, IsTerminal, Write};

/// Whether a destructive command can go ahead at all: with `--yes` or `--dry-run`, or with a
/// terminal to ask on. Without them it says so and changes nothing (exit 1, "not confirmed"),
/// before it calls the server: a preview nobody can confirm is not made (nor audited).
pub fn can_proceed(yes: bool, dry_run: bool) -> bool {
    if yes || dry_run || std::io::stdin().is_terminal() {
        return true;
    }
    eprintln!(
        "stdin is not a terminal to confirm on: run again with --yes to act (or --dry-run to see \
         what it would do)"
    );
    false
}

/// Asks on the terminal; without one, only `--yes` goes ahead.
pub fn confirm(question: &str, yes: bool) -> Result<bool, String> {
    if yes {
        return Ok(true);
    }
    if !can_proceed(false, false) {
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| format!("cannot read the confirmation: {e}"))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES"))
}
