//! The one migration rule, as a pure function every backend applies: given the migrations this
//! binary knows and those the database records as applied, which are pending, and whether this
//! binary may use the database at all.
//!
//! The rule (docs/decisions/051-one-migration-rule.md): a fleet upgrades one server at a time, so
//! for a while old and new binaries share one database. Every migration therefore keeps the
//! previous release working (it only adds; removing is a later migration, one release after the
//! code stopped using what it removes). So:
//!
//! - migrations this binary knows and the database lacks are **pending**: applied at open
//!   (`MigrationPolicy::Apply`) or refused (`Refuse`, `serve --no-migrate`);
//! - migrations the database has and this binary does not know, all *newer* than every one it
//!   knows, mean a newer binary migrated it: this binary **serves, with one warning**;
//! - anything else is a **diverging history** (an unknown migration older than the newest
//!   known one, the same version under another name, or a newer schema missing one of this
//!   binary's migrations): refused, because no release produced that database.
//!
//! No I/O here: each backend reads its `schema_migrations` rows, asks [`plan_migrations`], and
//! applies what it says.

use crate::error::ClaimsError;
use crate::ports::MigrationPolicy;

/// One migration: its number (strictly increasing) and its name (`0001_initial`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MigrationId {
    pub version: i64,
    pub name: String,
}

impl MigrationId {
    pub fn new(version: i64, name: impl Into<String>) -> Self {
        Self {
            version,
            name: name.into(),
        }
    }
}

impl std::fmt::Display for MigrationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.version, self.name)
    }
}

/// What a backend does at open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationPlan {
    /// Versions to apply, in order (empty when up to date, and always empty under `Refuse`).
    pub pending: Vec<i64>,
    /// Migrations a newer binary applied that this one does not know: serve, and warn once
    /// with [`MigrationPlan::newer_warning`].
    pub newer: Vec<MigrationId>,
}

impl MigrationPlan {
    /// The one warning line for a newer schema, or `None`.
    pub fn newer_warning(&self) -> Option<String> {
        (!self.newer.is_empty()).then(|| {
            let names: Vec<String> = self.newer.iter().map(ToString::to_string).collect();
            format!(
                "the database schema is newer than this binary (unknown migrations: {}); serving, \
                 since every migration keeps the previous release working. Finish the upgrade: \
                 this binary cannot use what those migrations added",
                names.join(", ")
            )
        })
    }
}

/// Decides what to do with a database whose applied migrations are `applied`, for a binary
/// that knows `known` (in version order), under `policy`.
pub fn plan_migrations(
    known: &[MigrationId],
    applied: &[MigrationId],
    policy: MigrationPolicy,
) -> Result<MigrationPlan, ClaimsError> {
    let newest_known = known.iter().map(|m| m.version).max().unwrap_or(0);
    let diverges = |detail: String| ClaimsError::Configuration {
        message: format!(
            "the database's schema history diverges from this binary's: {detail}; no release \
             of topology-claims produced this schema (docs/decisions/051-one-migration-rule.md)"
        ),
    };
    let mut newer = Vec::new();
    for migration in applied {
        match known.iter().find(|k| k.version == migration.version) {
            Some(k) if k.name != migration.name => {
                return Err(diverges(format!(
                    "version {} is {} in the database but {} in this binary",
                    migration.version, migration.name, k.name
                )))
            }
            Some(_) => {}
            None if migration.version > newest_known => newer.push(migration.clone()),
            None => {
                return Err(diverges(format!(
                    "the database has migration {migration}, which this binary does not know, \
                     though it knows newer ones"
                )))
            }
        }
    }
    newer.sort();
    let pending: Vec<&MigrationId> = known
        .iter()
        .filter(|k| !applied.iter().any(|a| a.version == k.version))
        .collect();
    if !newer.is_empty() && !pending.is_empty() {
        let missing: Vec<String> = pending.iter().map(ToString::to_string).collect();
        return Err(diverges(format!(
            "it has newer migrations but lacks {}",
            missing.join(", ")
        )));
    }
    if policy == MigrationPolicy::Refuse && !pending.is_empty() {
        return Err(ClaimsError::MigrationsPending {
            pending: pending.iter().map(|m| m.name.clone()).collect(),
        });
    }
    Ok(MigrationPlan {
        pending: pending.iter().map(|m| m.version).collect(),
        newer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[(i64, &str)]) -> Vec<MigrationId> {
        list.iter().map(|(v, n)| MigrationId::new(*v, *n)).collect()
    }

    const KNOWN: &[(i64, &str)] = &[(1, "0001_initial"), (2, "0002_updates")];

    #[test]
    fn a_fresh_database_gets_every_migration_in_order() {
        let plan = plan_migrations(&ids(KNOWN), &[], MigrationPolicy::Apply).unwrap();
        assert_eq!(plan.pending, vec![1, 2]);
        assert!(plan.newer.is_empty() && plan.newer_warning().is_none());
    }

    #[test]
    fn an_up_to_date_database_has_nothing_pending_under_either_policy() {
        for policy in [MigrationPolicy::Apply, MigrationPolicy::Refuse] {
            let plan = plan_migrations(&ids(KNOWN), &ids(KNOWN), policy).unwrap();
            assert_eq!(plan, MigrationPlan::default());
        }
    }

    #[test]
    fn pending_migrations_are_applied_or_refused_by_name() {
        let applied = ids(&[(1, "0001_initial")]);
        let plan = plan_migrations(&ids(KNOWN), &applied, MigrationPolicy::Apply).unwrap();
        assert_eq!(plan.pending, vec![2]);
        match plan_migrations(&ids(KNOWN), &applied, MigrationPolicy::Refuse) {
            Err(ClaimsError::MigrationsPending { pending }) => {
                assert_eq!(pending, vec!["0002_updates".to_owned()])
            }
            other => panic!("expected MigrationsPending, got {other:?}"),
        }
    }

    #[test]
    fn an_older_binary_serves_a_newer_schema_with_one_warning() {
        let applied = ids(&[(1, "0001_initial"), (2, "0002_updates"), (3, "0003_future")]);
        let known = ids(&[(1, "0001_initial"), (2, "0002_updates")]);
        for policy in [MigrationPolicy::Apply, MigrationPolicy::Refuse] {
            let plan = plan_migrations(&known, &applied, policy).unwrap();
            assert!(plan.pending.is_empty());
            assert_eq!(plan.newer, ids(&[(3, "0003_future")]));
            let warning = plan.newer_warning().unwrap();
            assert!(warning.contains("3 (0003_future)"), "{warning}");
        }
    }

    #[test]
    fn the_same_version_under_another_name_diverges() {
        let applied = ids(&[(1, "0001_other")]);
        let error = plan_migrations(&ids(KNOWN), &applied, MigrationPolicy::Apply).unwrap_err();
        assert!(error.to_string().contains("diverges"), "{error}");
        assert!(error.to_string().contains("0001_other"), "{error}");
    }

    #[test]
    fn an_unknown_migration_older_than_a_known_one_diverges() {
        let applied = ids(&[(0, "0000_fork"), (1, "0001_initial")]);
        let error = plan_migrations(&ids(KNOWN), &applied, MigrationPolicy::Apply).unwrap_err();
        assert!(error.to_string().contains("0000_fork"), "{error}");
    }

    #[test]
    fn a_newer_schema_with_a_gap_diverges() {
        let applied = ids(&[(1, "0001_initial"), (3, "0003_future")]);
        let error = plan_migrations(&ids(KNOWN), &applied, MigrationPolicy::Apply).unwrap_err();
        assert!(
            error.to_string().contains("lacks 2 (0002_updates)"),
            "{error}"
        );
    }
}
