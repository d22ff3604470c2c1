//! The store's locks stay within the documented per-transaction budget whatever the size of a
//! batch or a group: a transaction is caught holding every lock it takes (its claim insert
//! waits for another session's uncommitted insert of one of its keys) and its entries in
//! PostgreSQL's lock table are counted from `pg_locks`.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use topology_claims::domain::{GroupAnswer, GroupOp};
use topology_claims::{ClaimRecord, ClaimStore, ClaimType, LeaseId, MigrationPolicy};
use topology_claims_postgres::tokio_postgres::{self, Client, NoTls};
use topology_claims_postgres::{
    PostgresClaimStore, PostgresOptions, ADVISORY_LOCKS_PER_TRANSACTION,
};
use topology_claims_testkit::fixtures::{cell, creates, username};

/// Lock table entries a store transaction may hold besides its advisory locks: the four tables
/// it touches, their nine indexes, the TOAST tables and indexes of long values, and its own
/// transaction id (docs/backends/postgres.md, "Lock budget"); relation locks on PostgreSQL's
/// per-session fast path are not in the shared table and not counted here.
const OTHER_LOCKS: usize = 20;

/// A store whose one connection is named `app`, in a fresh schema.
async fn store_named(app: &str) -> Option<(PostgresClaimStore, String)> {
    common::admin().await?;
    let schema = common::fresh_schema_name();
    let options = PostgresOptions {
        application_name: Some(app.to_owned()),
        pool_size: 1,
        ..common::options(&schema)
    };
    let store = PostgresClaimStore::connect(&common::url(), options, MigrationPolicy::Apply)
        .await
        .expect("open the store");
    Some((store, schema))
}

/// Another session's uncommitted claim `value`: a transaction of the store that inserts it
/// waits, holding every lock it has taken, until `blocker` rolls back.
async fn block_insert_of(schema: &str, value: &str) -> Client {
    let (blocker, connection) = tokio_postgres::connect(&common::url(), NoTls)
        .await
        .expect("connect the blocker");
    tokio::spawn(connection);
    blocker.batch_execute("BEGIN").await.unwrap();
    let username = i16::try_from(ClaimType::Username.number()).unwrap();
    blocker
        .execute(
            &format!(
                "INSERT INTO \"{schema}\".claims VALUES \
                 ($1, $2, 1, 'blocker', 1, 1, 'cell-blocker', NULL, NULL, now(), now())"
            ),
            &[&username, &value],
        )
        .await
        .expect("the blocker's insert");
    blocker
}

/// The lock table entries of the backend named `app` once it waits for the blocker's
/// transaction (after its every other lock): granted locks by (locktype, on the fast path?),
/// counted.
async fn entries_while_waiting(admin: &Client, app: &str) -> BTreeMap<(String, bool), i64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: bool = admin
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks JOIN pg_stat_activity USING (pid)
                   WHERE application_name = $1 AND locktype = 'transactionid' AND NOT granted)",
                &[&app],
            )
            .await
            .unwrap()
            .get(0);
        if waiting {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{app} never waited for the blocker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin
        .query(
            "SELECT locktype, fastpath, count(*) FROM pg_locks JOIN pg_stat_activity USING (pid)
             WHERE application_name = $1 AND granted GROUP BY locktype, fastpath",
            &[&app],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| ((row.get(0), row.get(1)), row.get(2)))
        .collect()
}

/// Asserts the budget: advisory locks within [`ADVISORY_LOCKS_PER_TRANSACTION`], every other
/// lock-table entry within [`OTHER_LOCKS`].
fn assert_within_budget(entries: &BTreeMap<(String, bool), i64>, what: &str) {
    let count = |pick: &dyn Fn(&str, bool) -> bool| -> usize {
        entries
            .iter()
            .filter(|((kind, fastpath), _)| pick(kind, *fastpath))
            .map(|(_, n)| usize::try_from(*n).unwrap())
            .sum()
    };
    let advisory = count(&|kind, _| kind == "advisory");
    let other = count(&|kind, fastpath| kind != "advisory" && !fastpath);
    println!("{what}: {advisory} advisory locks, {other} other lock table entries: {entries:?}");
    assert!(
        advisory <= ADVISORY_LOCKS_PER_TRANSACTION,
        "{what}: {advisory} advisory locks: {entries:?}"
    );
    assert!(
        other <= OTHER_LOCKS,
        "{what}: {other} other locks: {entries:?}"
    );
}

fn many(prefix: &str, n: usize) -> Vec<ClaimRecord> {
    (0..n).map(|i| username(&format!("{prefix}-{i}"))).collect()
}

/// Runs `transaction` on a fresh store (one connection, named `name`) while another session
/// holds an uncommitted insert of claim `blocked`, which the transaction also inserts: the lock
/// table entries it holds once it waits there, and its outcome after the blocker rolls back.
/// `None`: PostgreSQL is not there (skipped).
async fn caught_waiting<F, T>(
    name: &str,
    blocked: &str,
    transaction: impl FnOnce(PostgresClaimStore) -> F,
) -> Option<(BTreeMap<(String, bool), i64>, T)>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let app = format!("tc-locks-{name}-{:08x}", fastrand::u32(..));
    let (store, schema) = store_named(&app).await?;
    let admin = common::admin().await?;
    let blocker = block_insert_of(&schema, blocked).await;
    let running = tokio::spawn(transaction(store));
    let entries = entries_while_waiting(&admin, &app).await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let outcome = running.await.unwrap();
    common::drop_schema(&admin, &schema).await;
    Some((entries, outcome))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_claim_begin_update_holds_at_most_the_lock_budget() {
    let request = creates(&cell("cell-a"), &many("lone", 1000));
    let Some((entries, begun)) = caught_waiting("lone", "lone-999", |store| async move {
        store.begin_update(request).await
    })
    .await
    else {
        return;
    };
    begun.expect("the BeginUpdate succeeds once the blocker is gone");
    assert_within_budget(&entries, "a BeginUpdate of 1,000 claims");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_a_thousand_begin_updates_holds_at_most_the_lock_budget() {
    // 1,000 lease ids, 1,000 cells, 3,000 claim keys in one transaction.
    let ops: Vec<GroupOp> = (0..1000)
        .map(|n| GroupOp::Begin {
            request: creates(&cell(&format!("cell-{n}")), &many(&format!("g{n}"), 3)),
            lease_id: LeaseId::generate(),
        })
        .collect();
    let Some((entries, results)) = caught_waiting("group", "g999-2", |store| async move {
        store.run_group(&ops).await
    })
    .await
    else {
        return;
    };
    let results = results.expect("the group commits");
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(GroupAnswer::Begun(_)))),
        "{:?}",
        results.iter().find(|r| r.is_err())
    );
    assert_within_budget(&entries, "a group of 1,000 BeginUpdates");
}
