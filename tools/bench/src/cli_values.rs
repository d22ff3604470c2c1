//! The bench's own value syntaxes on the command line: claim counts (`10k`, `1m`), the drift
//! fraction of `--verify`, and `--serve-variant NAME=ARGS`.
//!
//! Owns parsing only; what the values do is the run's business.

/// `10k`, `1m`, `10m` or a plain number of claims.
pub fn parse_count(text: &str) -> Result<u64, String> {
    let text = text.trim().to_ascii_lowercase();
    let (number, factor) = match text.strip_suffix('k') {
        Some(n) => (n, 1_000),
        None => match text.strip_suffix('m') {
            Some(n) => (n, 1_000_000),
            None => (text.as_str(), 1),
        },
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid claim count {text:?}: expected e.g. 10k, 1m, 10m or 5000"))
}

/// A fraction of each drift kind: three kinds of it must fit in the records.
pub fn parse_drift(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|f| (0.0..=0.3).contains(f))
        .ok_or_else(|| format!("invalid drift {text:?}: a fraction from 0 to 0.3, e.g. 0.01"))
}

/// One `--serve-variant`: a name for the label and the extra `serve` arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeVariant {
    pub name: String,
    pub args: Vec<String>,
}

/// `NAME=ARGS`: NAME of `[A-Za-z0-9._-]`, ARGS split on whitespace.
pub fn parse_variant(text: &str) -> Result<ServeVariant, String> {
    let (name, args) = text.split_once('=').ok_or_else(|| {
        format!("invalid serve variant {text:?}: expected NAME=ARGS, e.g. off=--group-commit=off")
    })?;
    let name = name.trim();
    // A name never starts with '-': `--serve-variant --group-commit=off` lacks its NAME=.
    if name.is_empty()
        || name.starts_with('-')
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(format!(
            "invalid serve variant name {name:?}: 1 or more of A-Z a-z 0-9 . _ -, not starting \
             with -; expected NAME=ARGS, e.g. off=--group-commit=off"
        ));
    }
    Ok(ServeVariant {
        name: name.to_owned(),
        args: args.split_whitespace().map(str::to_owned).collect(),
    })
}

pub fn parse_count_or_zero(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        Ok(0)
    } else {
        parse_count(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_variants_are_a_name_and_space_separated_arguments() {
        assert_eq!(
            parse_variant("on=--group-commit=on --group-max=16"),
            Ok(ServeVariant {
                name: "on".into(),
                args: vec!["--group-commit=on".into(), "--group-max=16".into()],
            })
        );
        assert_eq!(parse_variant("default=").map(|v| v.args.len()), Ok(0));
        assert!(parse_variant("--group-commit=off").is_err());
        assert!(parse_variant("a/b=--x").is_err());
        assert!(parse_variant("no-equals-sign").is_err());
    }

    #[test]
    fn claim_counts_take_k_and_m_suffixes() {
        assert_eq!(parse_count("10k"), Ok(10_000));
        assert_eq!(parse_count("1m"), Ok(1_000_000));
        assert_eq!(parse_count("10M"), Ok(10_000_000));
        assert_eq!(parse_count("2500"), Ok(2500));
        assert!(parse_count("0").is_err());
        assert!(parse_count("lots").is_err());
    }
}
