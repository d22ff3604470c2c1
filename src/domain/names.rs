//! Names from an open set (decision 111): what kind of entity owns a claim ([`OwnerType`]) and
//! which of a cell's tables implies it ([`TableName`]). A few built-ins keep the wire numbers of
//! the legacy protobuf enums; any other `[a-z0-9_]{1,63}` is taken as it is.

use std::fmt;

use crate::error::ClaimsError;

/// The refusal of a legacy enum's wire number that names nothing: 0 (unset) or unknown.
pub(crate) fn bad_number(number: i32, field: &str) -> ClaimsError {
    ClaimsError::invalid(
        field,
        if number == 0 {
            "must be specified".to_owned()
        } else {
            format!("unknown value {number}")
        },
    )
}

/// Longest owner type or source table name, in bytes.
pub const MAX_OPEN_NAME_LEN: usize = 63;

/// What is wrong with an owner type or source table name, if anything: `[a-z0-9_]{1,63}`.
fn open_name_problem(text: &str) -> Option<String> {
    if text.is_empty() {
        return Some("must not be empty".to_owned());
    }
    if text.len() > MAX_OPEN_NAME_LEN {
        return Some(format!(
            "must be at most {MAX_OPEN_NAME_LEN} bytes, got {}",
            text.len()
        ));
    }
    text.chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
        .map(|c| format!("{c:?} is not allowed: the name must match [a-z0-9_]{{1,63}}"))
}

/// The lowest hashed store number (below it: the built-ins' numbers, and room for more).
pub(crate) const FIRST_HASHED_NUMBER: i32 = 16;

/// The number a store keys a name outside the built-ins by: a fixed function of the name in
/// 16..=32767 (FNV-1a; PostgreSQL's `smallint`), so every server computes it without reading
/// the store. Two names may share a number: stores keep the name beside it and compare both.
pub(crate) fn hashed_store_number(text: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in text.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let first = FIRST_HASHED_NUMBER;
    let span = (i16::MAX as u32) - (first as u32) + 1;
    first + (hash % span) as i32
}

/// A name from an open set (decision 111): a few built-ins, each with a wire number (the legacy
/// protobuf enum), and any other `[a-z0-9_]{1,63}`. Cheap to clone for the built-ins.
macro_rules! open_name {
    ($(#[$meta:meta])* $name:ident { $($konst:ident = $num:literal => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(std::borrow::Cow<'static, str>);

        impl $name {
            $(pub const $konst: $name = $name(std::borrow::Cow::Borrowed($text));)+
            /// The built-ins, in wire-number order.
            pub const ALL: &'static [$name] = &[$($name::$konst),+];

            /// The wire number of a built-in (its legacy enum value); 0 for any other name.
            pub fn number(&self) -> i32 {
                match self.name() {
                    $($text => $num,)+
                    _ => 0,
                }
            }

            /// The number stores key the name by: a built-in's wire number, any other name's
            /// [`hashed_store_number`] (kept beside [`stored_name`](Self::stored_name)).
            pub fn store_number(&self) -> i32 {
                match self.number() {
                    0 => hashed_store_number(self.name()),
                    number => number,
                }
            }

            /// The built-in of a wire number; `None` for 0 (unspecified) and unknown numbers.
            pub fn from_number(number: i64) -> Option<Self> {
                match number {
                    $($num => Some($name::$konst),)+
                    _ => None,
                }
            }

            pub fn name(&self) -> &str {
                &self.0
            }

            /// A name as the CLI or a config file gives it, in any case.
            pub fn from_name(text: &str) -> Option<Self> {
                Self::parse_name(&text.to_ascii_lowercase(), "").ok()
            }

            /// A name as a request gives it: a built-in's name, or any `[a-z0-9_]{1,63}`.
            pub fn parse_name(text: &str, field: &str) -> Result<Self, ClaimsError> {
                $(if text == $text {
                    return Ok($name::$konst);
                })+
                match open_name_problem(text) {
                    Some(problem) => Err(ClaimsError::invalid(field, problem)),
                    None => Ok(Self(std::borrow::Cow::Owned(text.to_owned()))),
                }
            }

            /// Parses a legacy wire number, refusing unspecified and unknown values.
            pub fn parse_field(number: i32, field: &str) -> Result<Self, ClaimsError> {
                Self::from_number(number.into()).ok_or_else(|| bad_number(number, field))
            }

            /// The name a request gives as the legacy enum (`number`, 0 when unset) and as a
            /// string (`text`, empty when unset): one of them, or both agreeing.
            pub fn from_wire(
                number: i32,
                text: &str,
                number_field: &str,
                text_field: &str,
            ) -> Result<Self, ClaimsError> {
                match (number, text) {
                    (0, "") => Err(ClaimsError::invalid(
                        text_field,
                        format!("must be specified (or the legacy {number_field})"),
                    )),
                    (number, "") => Self::parse_field(number, number_field),
                    (0, text) => Self::parse_name(text, text_field),
                    (number, text) => {
                        let named = Self::parse_name(text, text_field)?;
                        let legacy = Self::parse_field(number, number_field)?;
                        if named != legacy {
                            return Err(ClaimsError::invalid(
                                text_field,
                                format!(
                                    "{text:?} disagrees with {number_field} {number} ({:?}); set \
                                     one of them",
                                    legacy.name()
                                ),
                            ));
                        }
                        Ok(named)
                    }
                }
            }

            /// The name as stores keep it beside [`store_number`](Self::store_number): `None`
            /// for a built-in, whose number says it.
            pub fn stored_name(&self) -> Option<&str> {
                (self.number() == 0).then(|| self.name())
            }

            /// The name a store's number and name columns hold; `None` when they are not one.
            pub fn from_stored(number: i64, name: Option<&str>) -> Option<Self> {
                match name {
                    Some(name) => Self::parse_name(name, "")
                        .ok()
                        .filter(|parsed| i64::from(parsed.store_number()) == number),
                    None => Self::from_number(number),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

open_name!(
    /// What kind of entity owns a claim: `group`, `project`, `user` or any other name.
    OwnerType { GROUP = 1 => "group", PROJECT = 2 => "project", USER = 3 => "user" }
);
open_name!(
    /// The cell's table that holds the record behind a claim (for verification): one of the
    /// five legacy tables or any other name.
    TableName {
        USERS = 1 => "users",
        EMAILS = 2 => "emails",
        ROUTES = 3 => "routes",
        PROJECTS = 4 => "projects",
        GROUPS = 5 => "groups",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legacy_number_and_its_name_are_one_value_and_others_are_names() {
        for table in TableName::ALL {
            let by_number = TableName::from_wire(table.number(), "", "n", "t").unwrap();
            let by_name = TableName::from_wire(0, table.name(), "n", "t").unwrap();
            let both = TableName::from_wire(table.number(), table.name(), "n", "t").unwrap();
            assert_eq!((&by_number, &by_name, &both), (table, table, table));
            assert_eq!(table.stored_name(), None, "the number says it");
            assert_eq!(table.store_number(), table.number());
        }
        let ssh = TableName::from_wire(0, "ssh_keys", "n", "t").unwrap();
        assert_eq!((ssh.number(), ssh.stored_name()), (0, Some("ssh_keys")));
        assert!((16..=i32::from(i16::MAX)).contains(&ssh.store_number()));
        let stored = TableName::from_stored(ssh.store_number().into(), Some("ssh_keys"));
        assert_eq!(stored, Some(ssh));
        assert_eq!(TableName::from_stored(3, Some("ssh_keys")), None, "corrupt");
        assert_eq!(TableName::from_stored(2, None), Some(TableName::EMAILS));
    }

    #[test]
    fn a_bad_name_or_a_disagreement_is_refused_naming_the_field() {
        let field = |result: Result<OwnerType, ClaimsError>| match result {
            Err(ClaimsError::InvalidRequest { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let wire = |n, text| OwnerType::from_wire(n, text, "r.owner", "r.owner_type");
        assert_eq!(field(wire(0, "")), "r.owner_type");
        assert_eq!(field(wire(9, "")), "r.owner");
        assert_eq!(field(wire(3, "group")), "r.owner_type");
        let long = "x".repeat(64);
        for bad in ["User", "a b", "é", &long] {
            assert_eq!(field(wire(0, bad)), "r.owner_type", "{bad:?}");
        }
        assert_eq!(wire(0, &"x".repeat(63)).unwrap().name().len(), 63);
        assert_eq!(OwnerType::from_name("User"), Some(OwnerType::USER));
    }
}
