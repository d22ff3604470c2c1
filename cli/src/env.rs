//! The environment as configuration: what every command's `TOPOLOGY_CLAIMS_*` variables mean
//! beyond clap's defaults (docs/operations.md, "Configuration from the environment").
//!
//! - An empty variable means unset (`TOPOLOGY_CLAIMS_HEALTH_LISTEN=` from a template with
//!   nothing filled in), never an empty value that fails later.
//! - Every switch takes the same words: true/false, 1/0, yes/no, on/off ([`switch`]).
//! - A bad value from a variable is reported under the variable's name, not only the flag's.
//! - Addresses are checked when the command line is read ([`address`]), before a store is
//!   opened or migrated.
//!
//! Must not hold any command's defaults or meaning: those stay on the flags.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Every variable this program reads starts with it.
pub const PREFIX: &str = "TOPOLOGY_CLAIMS_";

/// The value parser of every on/off flag: true/false, 1/0, yes/no, on/off (any case), the same
/// for a flag and its variable.
pub fn switch(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "{value:?} is not a switch: use true/false, 1/0, yes/no or on/off"
        )),
    }
}

/// Removes every `TOPOLOGY_CLAIMS_*` variable whose value is empty, so that clap sees it as
/// unset. Call first thing in `main`, before any thread exists.
pub fn drop_empty_variables() {
    let empty: Vec<OsString> = std::env::vars_os()
        .filter(|(name, value)| {
            value.is_empty() && name.to_str().is_some_and(|n| n.starts_with(PREFIX))
        })
        .map(|(name, _)| name)
        .collect();
    for name in empty {
        // Single-threaded here: nothing reads the environment concurrently.
        std::env::remove_var(name);
    }
}

/// Parses the command line like `C::parse`, except that an invalid value that came from a
/// variable (its flag not on the command line) is reported naming that variable.
pub fn parse<C: clap::Parser>() -> C {
    let args: Vec<OsString> = std::env::args_os().collect();
    match C::try_parse_from(&args) {
        Ok(parsed) => parsed,
        Err(error) => match from_variable(&C::command(), &args, &error) {
            Some(message) => {
                eprintln!("error: {message}");
                std::process::exit(2);
            }
            None => error.exit(),
        },
    }
}

/// For a value error whose flag was not given but has a variable that is set: the message naming
/// the variable.
fn from_variable(
    command: &clap::Command,
    args: &[OsString],
    error: &clap::Error,
) -> Option<String> {
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let ContextValue::String(shown) = error.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let long = shown
        .strip_prefix("--")?
        .split([' ', '=', '<'])
        .next()?
        .to_owned();
    let given = args.iter().any(|a| {
        a.to_str()
            .is_some_and(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}=")))
    });
    if given {
        return None;
    }
    let variable = find_env(command, &long)?;
    let value = std::env::var(&variable).unwrap_or_default();
    // clap's own explanation (the parser's reason, the accepted values), without its
    // "invalid value … for '--flag'" opening.
    let rendered = error.render().to_string();
    let mut lines = rendered.lines().map(str::trim);
    let first = lines.next().unwrap_or_default();
    let mut why: Vec<&str> = first
        .split_once("'>': ")
        .or_else(|| first.split_once("': "))
        .map(|(_, reason)| reason)
        .into_iter()
        .collect();
    why.extend(lines.filter(|line| !line.is_empty() && !line.starts_with("For more information")));
    Some(format!(
        "invalid value {value:?} in the environment variable {variable} (the value of \
         --{long}){}",
        if why.is_empty() {
            String::new()
        } else {
            format!(": {}", why.join(" "))
        }
    ))
}

/// The variable of the flag `--long` in `command` or any of its subcommands.
fn find_env(command: &clap::Command, long: &str) -> Option<String> {
    command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(long))
        .and_then(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_env(sub, long))
        })
}

/// The value parser of a listen address: `HOST:PORT` (IPv6 hosts in brackets) with a port in
/// 0..=65535 and a host that is not empty. Name resolution happens when binding.
pub fn address(value: &str) -> Result<String, String> {
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| format!("{value:?} is not HOST:PORT"))?;
    if host.is_empty() || host == "[]" {
        return Err(format!(
            "{value:?} has no host (use 0.0.0.0 or [::] for every address)"
        ));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!(
            "{value:?}: an IPv6 host goes in brackets, e.g. [::1]:50051"
        ));
    }
    port.parse::<u16>()
        .map_err(|_| format!("{value:?}: the port {port:?} is not a number in 0..=65535"))?;
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_and_port() {
        for ok in ["127.0.0.1:50051", "0.0.0.0:0", "[::1]:9090", "localhost:80"] {
            assert_eq!(address(ok).as_deref(), Ok(ok), "{ok}");
        }
        for bad in [
            "",
            "50051",
            ":50051",
            "host:",
            "host:http",
            "::1:80",
            "h:65536",
        ] {
            assert!(address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_switch_word_is_read_the_same() {
        let parse = switch;
        for word in ["true", "1", "yes", "on", "ON", "True"] {
            assert!(parse(word).unwrap(), "{word}");
        }
        for word in ["false", "0", "no", "off", "OFF"] {
            assert!(!parse(word).unwrap(), "{word}");
        }
        assert!(parse("maybe").is_err());
    }
}
