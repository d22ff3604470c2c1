//! The admin `Namespace` messages ↔ the domain's namespaces (`topology_claims::domain`):
//! what the server answers ListNamespaces / GetNamespace / UpdateNamespace with, and the
//! validation of an UpdateNamespaceRequest (every refusal names its field).

use topology_claims::domain::{
    Namespace, NamespaceSpec, NamespaceUpdate, Normalization, StoredNamespace,
};
use topology_claims::error::ClaimsError;

use crate::pb::admin as apb;

/// The wire enum of a normalization.
pub fn normalization_to_pb(normalization: Normalization) -> apb::Normalization {
    match normalization {
        Normalization::Exact => apb::Normalization::Exact,
        Normalization::AsciiCaseInsensitive => apb::Normalization::AsciiCaseInsensitive,
        Normalization::PrecisUsername => apb::Normalization::PrecisUsername,
    }
}

/// A namespace as the admin API shows it.
pub fn namespace_to_pb(stored: &StoredNamespace) -> apb::Namespace {
    let namespace = &stored.namespace;
    apb::Namespace {
        id: namespace.id.to_string(),
        normalization: normalization_to_pb(namespace.rules.normalization) as i32,
        max_chars: u32::from(namespace.rules.max_chars),
        pattern: namespace
            .rules
            .pattern
            .as_ref()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default(),
        reserved: namespace.reserved.clone(),
        description: namespace.description.clone(),
        deprecated: namespace.deprecated,
        version: namespace.version,
    }
}

/// A namespace as the admin API showed it (a client reading ListNamespaces), with its store
/// number (a function of its id).
pub fn namespace_from_pb(message: &apb::Namespace) -> Result<StoredNamespace, ClaimsError> {
    let normalization =
        Normalization::from_number(i64::from(message.normalization)).ok_or_else(|| {
            ClaimsError::invalid(
                "normalization",
                format!("unknown normalization {}", message.normalization),
            )
        })?;
    let spec = NamespaceSpec {
        id: message.id.clone(),
        normalization,
        max_chars: u16::try_from(message.max_chars).unwrap_or(u16::MAX),
        pattern: (!message.pattern.is_empty()).then(|| message.pattern.clone()),
        reserved: message.reserved.clone(),
        description: message.description.clone(),
        deprecated: message.deprecated,
    };
    let namespace = Namespace::from_spec(spec, message.version)?;
    Ok(StoredNamespace {
        number: namespace.id.store_number(),
        namespace,
    })
}

/// The definition a CreateNamespaceRequest asks for (validated by the domain when decided;
/// here only what the wire can get wrong).
pub fn namespace_spec_from_pb(
    message: Option<&apb::Namespace>,
) -> Result<NamespaceSpec, ClaimsError> {
    let message = message.ok_or_else(|| ClaimsError::invalid("namespace", "is required"))?;
    let normalization =
        Normalization::from_number(i64::from(message.normalization)).ok_or_else(|| {
            ClaimsError::invalid(
                "namespace.normalization",
                "must be set: 1 exact, 2 ascii-case-insensitive, 3 precis-username",
            )
        })?;
    let max_chars = match message.max_chars {
        0 => topology_claims::domain::namespaces::DEFAULT_MAX_CHARS,
        n => u16::try_from(n).ok().filter(|n| *n <= 255).ok_or_else(|| {
            ClaimsError::invalid(
                "namespace.max_chars",
                format!("must be in 1..=255, got {n}"),
            )
        })?,
    };
    Ok(NamespaceSpec {
        id: message.id.clone(),
        normalization,
        max_chars,
        pattern: (!message.pattern.is_empty()).then(|| message.pattern.clone()),
        reserved: message.reserved.clone(),
        description: message.description.clone(),
        deprecated: message.deprecated,
    })
}

/// The namespace id and the change an UpdateNamespaceRequest asks for. The values are checked
/// by the domain when the change is decided (`domain::decide_namespace_update`); here only what
/// the wire can get wrong: an unknown normalization number, a `max_chars` out of range.
pub fn namespace_update_from_pb(
    request: &apb::UpdateNamespaceRequest,
) -> Result<(String, NamespaceUpdate), ClaimsError> {
    if request.id.is_empty() {
        return Err(ClaimsError::invalid("id", "must name a namespace"));
    }
    let normalization = match request.normalization {
        0 => None,
        number => Some(Normalization::from_number(i64::from(number)).ok_or_else(|| {
            ClaimsError::invalid(
                "normalization",
                format!("unknown normalization {number} (1 exact, 2 ascii-case-insensitive, 3 precis-username)"),
            )
        })?),
    };
    let max_chars = request
        .max_chars
        .map(|n| {
            u16::try_from(n)
                .ok()
                .filter(|n| (1..=255).contains(n))
                .ok_or_else(|| {
                    ClaimsError::invalid("max_chars", format!("must be in 1..=255, got {n}"))
                })
        })
        .transpose()?;
    let update = NamespaceUpdate {
        normalization,
        max_chars,
        pattern: request
            .pattern
            .as_ref()
            .map(|p| (!p.is_empty()).then(|| p.clone())),
        reserved: request.set_reserved.then(|| request.reserved.clone()),
        description: request.description.clone(),
        deprecated: request.deprecated,
    };
    Ok((request.id.clone(), update))
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology_claims::domain::NamespaceSet;

    #[test]
    fn a_builtin_is_shown_with_its_rules() {
        let set = NamespaceSet::builtins();
        let shown = namespace_to_pb(set.find("usernames").unwrap());
        assert_eq!(
            shown.normalization,
            apb::Normalization::PrecisUsername as i32
        );
        assert_eq!((shown.max_chars, shown.version), (255, 1));
        assert_eq!(shown.pattern, "");
        assert_eq!(
            &namespace_from_pb(&shown).unwrap(),
            set.find("usernames").unwrap()
        );
    }

    #[test]
    fn an_update_keeps_what_it_does_not_set_and_refuses_by_field() {
        let request = apb::UpdateNamespaceRequest {
            id: "emails".into(),
            pattern: Some(String::new()),
            set_reserved: true,
            ..Default::default()
        };
        let (id, update) = namespace_update_from_pb(&request).unwrap();
        assert_eq!(id, "emails");
        assert_eq!(update.pattern, Some(None), "the empty pattern removes it");
        assert_eq!(update.reserved, Some(vec![]));
        assert_eq!((update.normalization, update.max_chars), (None, None));
        for (request, field) in [
            (
                apb::UpdateNamespaceRequest {
                    id: "emails".into(),
                    normalization: 9,
                    ..Default::default()
                },
                "normalization",
            ),
            (
                apb::UpdateNamespaceRequest {
                    id: "emails".into(),
                    max_chars: Some(256),
                    ..Default::default()
                },
                "max_chars",
            ),
            (apb::UpdateNamespaceRequest::default(), "id"),
        ] {
            match namespace_update_from_pb(&request) {
                Err(ClaimsError::InvalidRequest { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
