//! The confirmation the destructive operator commands ask for (`admin force-rollback`,
//! `decommission`, `mark-restored`, `lift-quarantine`), and `--yes`.

use std::io::{BufRead, IsTerminal, Write};

/// Asks on the terminal; without one, only `--yes` goes ahead.
pub fn confirm(question: &str, yes: bool) -> Result<bool, String> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "{question}: stdin is not a terminal to confirm on; run again with --yes"
        ));
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
