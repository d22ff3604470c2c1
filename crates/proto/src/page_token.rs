//! The page token of ListClaims and StreamClaims (`page_token` / `next_page_token`): one opaque
//! string that carries a listing's whole position, a record split over pages included, so that a
//! client cannot half-follow it (docs/decisions/079-one-page-token.md).
//!
//! A token is built and checked here only. It holds the position ([`ClaimsCursor`]: record id
//! and, inside a record, the last claim's type and value) and the table, followed by a checksum
//! over a fixed label, the cell id of the listing and those bytes, all in base64url without
//! padding. The checksum is an *integrity* check, not a secret: anyone can read a token, and a
//! deliberate forger can compute a valid one, but it could only name a position of its own
//! cell's listing (the authorization layer checks the request's cell id), which `cursor` and
//! `cursor_key` can name anyway. What it catches is the careless peer: a token altered, cut
//! short, or sent back for another cell or table is INVALID_ARGUMENT naming `page_token`, never
//! a silently wrong page.
//!
//! Must not decide paging (where a page ends is `domain::pages`); it only encodes a position.

use aws_lc_rs::digest;

use topology_claims::domain::{
    check_record_id, check_value, namespaces::MAX_NAMESPACE_ID_LEN, CellId, ClaimKey, ClaimType,
    ClaimsCursor, NamespaceId, TableName, MAX_VALUE_LEN, PAGE_TOKEN_MAX_LEN,
};
use topology_claims::error::ClaimsError;

/// The request field every token error names.
pub const FIELD: &str = "page_token";

/// The layout's version: the first byte, so that a later layout can be told apart. Version 1
/// named the claim inside a record by its claim type (i32); version 2 by its namespace id
/// (length-prefixed). Tokens of version 1 are still read: a listing outlives an upgrade.
const VERSION: u8 = 2;
const VERSION_CLAIM_TYPE: u8 = 1;
/// Separates the checksums of page tokens from any other use of SHA-256 over similar bytes.
const LABEL: &[u8] = b"topology-claims.v1.page-token\0";
/// Bytes of SHA-256 kept: 128 bits, far beyond what a careless change could hit by chance.
const CHECKSUM_LEN: usize = 16;
/// version, table (i32), record id (i64), namespace id length (u8; 0: no key), then the
/// namespace id and the claim's key.
const FIXED_LEN: usize = 1 + 4 + 8 + 1;
/// Version 1: a claim type (i32; 0: no key) instead of the namespace id's length and bytes.
const FIXED_LEN_V1: usize = 1 + 4 + 8 + 4;
/// The longest token in bytes before base64: a key with the longest namespace and value.
const MAX_BYTES: usize = FIXED_LEN + MAX_NAMESPACE_ID_LEN + MAX_VALUE_LEN + CHECKSUM_LEN;
/// The longest token as sent: base64 of [`MAX_BYTES`] without padding.
pub const MAX_LEN: usize = (MAX_BYTES * 4).div_ceil(3);
const _: () = assert!(
    MAX_LEN <= PAGE_TOKEN_MAX_LEN,
    "the response budget counts tokens"
);

/// The token of `position` in the listing of `table` by `cell_id`.
pub fn encode(cell_id: &CellId, table: &TableName, position: &ClaimsCursor) -> String {
    let mut bytes = Vec::with_capacity(MAX_BYTES);
    bytes.push(VERSION);
    bytes.extend_from_slice(&table.store_number().to_be_bytes());
    bytes.extend_from_slice(&position.record_id.to_be_bytes());
    match &position.after_key {
        Some(key) => {
            let namespace = key.namespace.as_str().as_bytes();
            bytes.push(u8::try_from(namespace.len()).expect("a namespace id is at most 63 bytes"));
            bytes.extend_from_slice(namespace);
            bytes.extend_from_slice(key.value.as_bytes());
        }
        None => bytes.push(0),
    }
    let checksum = checksum(cell_id, table, &bytes);
    bytes.extend_from_slice(&checksum);
    base64url::encode(&bytes)
}

/// The position of a token this server issued for the listing of `table` by `cell_id`; any
/// other string is INVALID_ARGUMENT naming [`FIELD`], saying what is wrong with it.
pub fn decode(
    token: &str,
    cell_id: &CellId,
    table: &TableName,
) -> Result<ClaimsCursor, ClaimsError> {
    let refuse = |why: String| ClaimsError::invalid(FIELD, why);
    if token.len() > MAX_LEN {
        return Err(refuse(format!(
            "{} characters, longer than any page token this server issues ({MAX_LEN}); send \
             back next_page_token unchanged",
            token.len()
        )));
    }
    let bytes = base64url::decode(token).ok_or_else(|| {
        refuse(
            "not a page token of this server (not base64url); send back next_page_token unchanged"
                .into(),
        )
    })?;
    if bytes.len() < FIXED_LEN + CHECKSUM_LEN {
        return Err(refuse(
            "too short to be a page token (cut off?); send back next_page_token unchanged".into(),
        ));
    }
    let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
    if checksum(cell_id, table, body) != sum {
        return Err(refuse(format!(
            "does not check out for cell {cell_id}: it was altered, or issued for another cell's \
             listing; send back next_page_token unchanged, in a request for the same cell and table"
        )));
    }
    let fixed_len = match body[0] {
        VERSION => FIXED_LEN,
        VERSION_CLAIM_TYPE => FIXED_LEN_V1,
        version => return Err(refuse(format!("unknown page token version {version}"))),
    };
    if body.len() < fixed_len {
        return Err(refuse(
            "too short to be a page token (cut off?); send back next_page_token unchanged".into(),
        ));
    }
    let issued_for = i32::from_be_bytes(body[1..5].try_into().expect("4 bytes"));
    if issued_for != table.store_number() {
        let name = TableName::from_number(issued_for.into())
            .map_or_else(|| "another table".to_owned(), |t| format!("table {t}"));
        return Err(refuse(format!(
            "issued for the listing of {name}, not {table}; a token continues the listing it \
             came from"
        )));
    }
    let record_id = i64::from_be_bytes(body[5..13].try_into().expect("8 bytes"));
    check_record_id(record_id, FIELD)?;
    let (namespace, value) = if body[0] == VERSION_CLAIM_TYPE {
        let claim_type = i32::from_be_bytes(body[13..17].try_into().expect("4 bytes"));
        let namespace = match claim_type {
            0 => None,
            number => Some(NamespaceId::of_claim_type(ClaimType::parse_field(
                number, FIELD,
            )?)),
        };
        (namespace, &body[FIXED_LEN_V1..])
    } else {
        let len = usize::from(body[13]);
        let rest = &body[FIXED_LEN..];
        if rest.len() < len {
            return Err(refuse("a namespace id cut short".into()));
        }
        let namespace = match len {
            0 => None,
            _ => {
                let id = std::str::from_utf8(&rest[..len])
                    .map_err(|_| refuse("a namespace id that is not UTF-8".into()))?;
                Some(NamespaceId::parse_field(id, FIELD)?)
            }
        };
        (namespace, &rest[len..])
    };
    let after_key = match namespace {
        None if value.is_empty() => None,
        None => return Err(refuse("a claim value without a namespace".into())),
        Some(namespace) => {
            let value = std::str::from_utf8(value)
                .map_err(|_| refuse("a claim value that is not UTF-8".into()))?;
            check_value(value, FIELD)?;
            Some(ClaimKey::new(namespace, value))
        }
    };
    Ok(ClaimsCursor {
        record_id,
        after_key,
    })
}

fn checksum(cell_id: &CellId, table: &TableName, body: &[u8]) -> [u8; CHECKSUM_LEN] {
    let mut context = digest::Context::new(&digest::SHA256);
    context.update(LABEL);
    context.update(cell_id.as_str().as_bytes());
    // The cell id's end: no cell id and body can be read as another cell id and body.
    context.update(&[0]);
    // A table outside the five legacy ones is known by a hashed number (two may share it): its
    // name is checked too. (Not for the legacy ones, whose tokens stay what they were.)
    if let Some(name) = table.stored_name() {
        context.update(name.as_bytes());
        context.update(&[0]);
    }
    context.update(body);
    let full = context.finish();
    let mut sum = [0; CHECKSUM_LEN];
    sum.copy_from_slice(&full.as_ref()[..CHECKSUM_LEN]);
    sum
}

/// RFC 4648 §5 base64url without padding, strict: a string that any other bytes would encode
/// differently (a character outside the alphabet, a length no encoding has, unused bits set in
/// the last character) does not decode, so that every changed character changes the bytes.
mod base64url {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity((bytes.len() * 4).div_ceil(3));
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            }
        }
        out
    }

    pub fn decode(text: &str) -> Option<Vec<u8>> {
        let sextet = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|p| p as u32);
        let mut out = Vec::with_capacity(text.len() * 3 / 4);
        for chunk in text.as_bytes().chunks(4) {
            if chunk.len() == 1 {
                return None;
            }
            let mut n = 0u32;
            for (i, &c) in chunk.iter().enumerate() {
                n |= sextet(c)? << (18 - 6 * i);
            }
            let len = chunk.len() - 1;
            // Bits below the last whole byte must be zero (canonical encoding).
            if n & ((1 << (24 - 8 * len)) - 1) != 0 {
                return None;
            }
            out.extend((0..len).map(|i| (n >> (16 - 8 * i)) as u8));
        }
        Some(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn base64url_matches_rfc_4648_test_vectors_without_padding() {
            for (bytes, text) in [
                ("", ""),
                ("f", "Zg"),
                ("fo", "Zm8"),
                ("foo", "Zm9v"),
                ("foob", "Zm9vYg"),
                ("fooba", "Zm9vYmE"),
                ("foobar", "Zm9vYmFy"),
            ] {
                assert_eq!(encode(bytes.as_bytes()), text);
                assert_eq!(decode(text).as_deref(), Some(bytes.as_bytes()));
            }
            assert_eq!(encode(&[0xfb, 0xff]), "-_8");
        }

        #[test]
        fn base64url_refuses_padding_foreign_characters_and_unused_bits() {
            for text in ["Zg==", "Zm9v+", "Zm9v/", "Z", "Zh", "Zm9", "Zm 9v"] {
                assert_eq!(decode(text), None, "{text}");
            }
            assert_eq!(decode("Zm8"), Some(b"fo".to_vec()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(name: &str) -> CellId {
        CellId::parse(name).unwrap()
    }

    fn positions() -> Vec<ClaimsCursor> {
        vec![
            ClaimsCursor::at(0),
            ClaimsCursor::at(i64::MAX - 1),
            ClaimsCursor {
                record_id: 42,
                after_key: Some(ClaimKey::new(ClaimType::Email, "a@example.com")),
            },
            ClaimsCursor {
                record_id: 7,
                after_key: Some(ClaimKey::new(
                    ClaimType::Routes,
                    "é".repeat(MAX_VALUE_LEN / 2),
                )),
            },
            ClaimsCursor {
                record_id: 7,
                after_key: Some(ClaimKey::new(
                    ClaimType::Username,
                    "x".repeat(MAX_VALUE_LEN),
                )),
            },
        ]
    }

    #[test]
    fn a_token_decodes_to_the_position_it_was_built_from() {
        let ssh_keys = TableName::from_name("ssh_keys").unwrap();
        for table in TableName::ALL.iter().chain([&ssh_keys]) {
            for position in positions() {
                let token = encode(&cell("cell-a"), table, &position);
                assert!(token.len() <= MAX_LEN, "{} > {MAX_LEN}", token.len());
                assert!(token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
                assert_eq!(decode(&token, &cell("cell-a"), table), Ok(position));
            }
        }
    }

    fn refused(token: &str, cell_id: &str, table: TableName) -> String {
        match decode(token, &cell(cell_id), &table) {
            Err(ClaimsError::InvalidRequest { field, description }) => {
                assert_eq!(field, FIELD);
                description
            }
            other => panic!("{token:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn every_single_bit_flip_of_a_token_is_refused() {
        for position in positions() {
            let token = encode(&cell("cell-a"), &TableName::USERS, &position);
            for i in 0..token.len() {
                for bit in 0..8 {
                    let mut bytes = token.clone().into_bytes();
                    bytes[i] ^= 1 << bit;
                    // A flip that is not UTF-8 cannot be a protobuf string at all.
                    if let Ok(altered) = String::from_utf8(bytes) {
                        refused(&altered, "cell-a", TableName::USERS);
                    }
                }
            }
            // And every flip of the bytes under the base64, re-encoded as a well-formed string.
            let bytes = base64url::decode(&token).unwrap();
            for i in 0..bytes.len() {
                for bit in 0..8 {
                    let mut altered = bytes.clone();
                    altered[i] ^= 1 << bit;
                    let description =
                        refused(&base64url::encode(&altered), "cell-a", TableName::USERS);
                    assert!(description.contains("does not check out"), "{description}");
                }
            }
        }
    }

    #[test]
    fn a_token_of_another_cell_or_table_is_refused_naming_what_it_belongs_to() {
        let position = ClaimsCursor {
            record_id: 42,
            after_key: Some(ClaimKey::new(ClaimType::Email, "a@example.com")),
        };
        let token = encode(&cell("cell-a"), &TableName::USERS, &position);
        let description = refused(&token, "cell-b", TableName::USERS);
        assert!(description.contains("another cell"), "{description}");
        let description = refused(&token, "cell-a", TableName::EMAILS);
        assert!(
            description.contains("table users, not emails"),
            "{description}"
        );
        // A table outside the legacy ones is checked by name too.
        let description = refused(&token, "cell-a", TableName::from_name("keys").unwrap());
        assert!(
            description.contains("for the same cell and table"),
            "{description}"
        );
    }

    #[test]
    fn a_token_of_another_table_with_the_same_store_number_is_refused() {
        // Two free-form tables whose hashed numbers collide (a few hundred names find one).
        let mut seen = std::collections::HashMap::new();
        let (first, second) = (0..)
            .find_map(|i| {
                let table = TableName::from_name(&format!("t{i}")).unwrap();
                seen.insert(table.store_number(), table.clone())
                    .map(|earlier| (earlier, table))
            })
            .unwrap();
        assert_eq!(first.store_number(), second.store_number());
        let token = encode(&cell("cell-a"), &first, &ClaimsCursor::at(9));
        assert_eq!(
            decode(&token, &cell("cell-a"), &first),
            Ok(ClaimsCursor::at(9))
        );
        let description = refused(&token, "cell-a", second);
        assert!(description.contains("does not check out"), "{description}");
    }

    #[test]
    fn strings_that_are_not_tokens_are_refused() {
        let token = encode(&cell("c"), &TableName::USERS, &ClaimsCursor::at(3));
        for text in [
            "",
            "not a token",
            "AAAA",
            &token[..token.len() - 1],
            &format!("{token}AA"),
            &"A".repeat(MAX_LEN + 1),
        ] {
            refused(text, "c", TableName::USERS);
        }
    }
}
