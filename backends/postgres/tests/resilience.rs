//! PostgreSQL going away under the store: backends terminated mid-run, the server unreachable
//! and back (through a TCP proxy the test stops and restarts), statements over the timeout.
//! Requests fail `Unavailable` with a clear message, the store heals by itself, and no batch is
//! ever half applied.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use topology_claims::{BeginUpdate, ClaimStore, ClaimsError, LeaseId};
use topology_claims_postgres::tokio_postgres::config::Host;
use topology_claims_postgres::tokio_postgres::{Client, Config};
use topology_claims_postgres::{PostgresClaimStore, PostgresOptions};
use topology_claims_server::group::{GroupCommit, GroupConfig};
use topology_claims_testkit::fixtures::{cell, username};

/// What the store holds for one lease id: (outstanding?, outcome, claims carrying it).
async fn lease_rows(admin: &Client, schema: &str, lease_id: LeaseId) -> (bool, Option<i16>, i64) {
    let id = *lease_id.as_uuid();
    let row = admin
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM {schema}.leases WHERE lease_id = $1),
                        (SELECT outcome FROM {schema}.lease_outcomes WHERE lease_id = $1),
                        (SELECT count(*) FROM {schema}.claims WHERE lease_id = $1)"
            ),
            &[&id],
        )
        .await
        .expect("read lease rows");
    (row.get(0), row.get(1), row.get(2))
}

/// Schema-wide invariants: every leased claim's lease is outstanding; no lease both
/// outstanding and ended.
async fn check_global_invariants(admin: &Client, schema: &str) {
    let row = admin
        .query_one(
            &format!(
                "SELECT
                   (SELECT count(*) FROM {schema}.claims c WHERE c.lease_id IS NOT NULL
                      AND NOT EXISTS (SELECT 1 FROM {schema}.leases l WHERE l.lease_id = c.lease_id)),
                   (SELECT count(*) FROM {schema}.leases l
                      JOIN {schema}.lease_outcomes o USING (lease_id))"
            ),
            &[],
        )
        .await
        .expect("check invariants");
    let (orphan_markers, both): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        orphan_markers, 0,
        "claims leased by a lease that is not outstanding"
    );
    assert_eq!(both, 0, "leases both outstanding and ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_backends_mid_run_recover_and_leave_no_half_applied_batch() {
    terminated_backends_mid_run(false).await;
}

/// The same with every BeginUpdate and CommitUpdate in groups (two at a time, so workers share
/// them): a group whose connection dies is retried whole, or fails whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_backends_mid_run_leave_no_half_applied_group() {
    terminated_backends_mid_run(true).await;
}

async fn terminated_backends_mid_run(grouped: bool) {
    let Some(admin) = common::admin().await else {
        return;
    };
    let schema = common::fresh_schema_name();
    let app = format!("tc-kill-{schema}");
    let options = PostgresOptions {
        application_name: Some(app.clone()),
        ..common::options(&schema)
    };
    let store = Arc::new(
        PostgresClaimStore::connect(&common::url(), options, Default::default())
            .await
            .expect("open the store"),
    );
    let service: Arc<dyn ClaimStore> = if grouped {
        let config = GroupConfig {
            parallelism: Some(2),
            ..GroupConfig::default()
        };
        Arc::new(GroupCommit::new(store.clone(), config))
    } else {
        store.clone()
    };

    // Workers: begin (client-chosen lease id) then commit, over partly shared keys.
    let mut workers = JoinSet::new();
    for worker in 0..6 {
        let store = Arc::clone(&service);
        workers.spawn(async move {
            let mut attempts = Vec::new();
            for i in 0..30 {
                let request = BeginUpdate {
                    local_transaction: None,
                    cell_id: cell(&format!("cell-{}", worker % 3)),
                    lease_id: Some(LeaseId::generate()),
                    creates: vec![
                        username(&format!("w{worker}-i{i}-a")),
                        username(&format!("w{worker}-i{i}-b")),
                        username(&format!("shared-{i}")),
                    ],
                    destroys: vec![],
                    updates: Vec::new(),
                };
                let begun = store.begin_update(request.clone()).await;
                let committed = match &begun {
                    Ok(lease) => Some(store.commit_update(&request.cell_id, lease.lease_id).await),
                    Err(_) => None,
                };
                attempts.push((request, begun, committed));
            }
            attempts
        });
    }
    // The killer: terminate every backend of this store, repeatedly, while the workers run.
    let terminated = Arc::new(AtomicU64::new(0));
    let killer = {
        let (app, terminated) = (app.clone(), Arc::clone(&terminated));
        let url = common::url();
        tokio::spawn(async move {
            let (killer, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("killer connects");
            tokio::spawn(connection);
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let row = killer
                    .query_one(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
                         FROM pg_stat_activity WHERE application_name = $1",
                        &[&app],
                    )
                    .await
                    .expect("terminate backends");
                terminated.fetch_add(row.get::<_, i64>(0) as u64, Ordering::Relaxed);
            }
        })
    };
    let mut attempts = Vec::new();
    while let Some(joined) = workers.join_next().await {
        attempts.extend(joined.expect("worker"));
    }
    killer.await.expect("killer");
    assert!(
        terminated.load(Ordering::Relaxed) > 0,
        "the run must actually lose backends"
    );

    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for (request, begun, committed) in &attempts {
        let lease_id = request.lease_id.expect("client-chosen");
        for result in [
            begun.as_ref().err(),
            committed.as_ref().and_then(|c| c.as_ref().err()),
        ] {
            match result.map(ClaimsError::refusal) {
                None => {}
                Some(ClaimsError::Unavailable { .. }) => {
                    *outcomes.entry("unavailable").or_default() += 1
                }
                Some(ClaimsError::ClaimLeased { .. } | ClaimsError::ClaimTaken { .. }) => {
                    *outcomes.entry("refused").or_default() += 1
                }
                Some(other) => panic!("lease {lease_id}: unexpected error {other:?}"),
            }
        }
        // All or nothing: an outstanding lease carries all its claims, any other none.
        let (outstanding, outcome, carrying) = lease_rows(&admin, &schema, lease_id).await;
        if outstanding {
            assert_eq!(
                carrying,
                request.len() as i64,
                "lease {lease_id} holds all its claims"
            );
        } else {
            assert_eq!(
                carrying, 0,
                "lease {lease_id} (outcome {outcome:?}) holds no claim"
            );
        }
        if let (Ok(_), Some(Ok(()))) = (begun, committed) {
            assert_eq!(outcome, Some(1), "an acknowledged commit is durable");
            for record in &request.creates {
                let claim = store
                    .lookup_claim(&record.key)
                    .await
                    .expect("committed claim");
                assert_eq!(claim.cell_id, request.cell_id);
            }
        }
    }
    check_global_invariants(&admin, &schema).await;

    // The next requests work, without any help.
    let after = BeginUpdate {
        lease_id: None,
        ..topology_claims_testkit::fixtures::creates(
            &cell("cell-a"),
            &[username("after-the-storm")],
        )
    };
    let lease = service
        .begin_update(after)
        .await
        .expect("a request after the kills succeeds");
    service
        .commit_update(&cell("cell-a"), lease.lease_id)
        .await
        .expect("and its commit");
    println!(
        "kill run (grouped: {grouped}): terminated {terminated:?} backends, outcomes {outcomes:?}, {:?}",
        store.stats()
    );
    common::drop_schema(&admin, &schema).await;
}

/// A TCP proxy in front of PostgreSQL that the test can take down (closing every connection and
/// refusing new ones) and bring back on the same port.
struct Proxy {
    addr: SocketAddr,
    upstream: Upstream,
    task: Option<JoinHandle<()>>,
}

#[derive(Clone)]
enum Upstream {
    Tcp(String),
    Unix(std::path::PathBuf),
}

impl Proxy {
    async fn start(upstream: Upstream) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let mut proxy = Proxy {
            addr,
            upstream,
            task: None,
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&mut self, listener: TcpListener) {
        let upstream = self.upstream.clone();
        self.task = Some(tokio::spawn(async move {
            // Dropping this set (the task aborted) closes every proxied connection.
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let upstream = upstream.clone();
                connections.spawn(async move {
                    match upstream {
                        Upstream::Tcp(addr) => {
                            if let Ok(mut out) = tokio::net::TcpStream::connect(addr).await {
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                            }
                        }
                        Upstream::Unix(path) => {
                            if let Ok(mut out) = tokio::net::UnixStream::connect(path).await {
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                            }
                        }
                    }
                });
            }
        }));
    }

    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("re-bind the proxy's port");
        self.serve(listener);
    }
}

fn upstream_of(url: &str) -> (Upstream, Config) {
    let config: Config = url.parse().expect("a valid test URL");
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let upstream = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => Upstream::Tcp(format!("{host}:{port}")),
        Some(Host::Unix(dir)) => Upstream::Unix(dir.join(format!(".s.PGSQL.{port}"))),
        None => Upstream::Tcp(format!("localhost:{port}")),
    };
    (upstream, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_fail_unavailable_while_postgres_is_down_and_recover_when_it_is_back() {
    let Some(admin) = common::admin().await else {
        return;
    };
    let (upstream, config) = upstream_of(&common::url());
    let mut proxy = Proxy::start(upstream).await;
    let user = config.get_user().unwrap_or("postgres");
    let db = config.get_dbname().unwrap_or(user);
    let url = format!("postgres://{user}@{}/{db}", proxy.addr);
    let schema = common::fresh_schema_name();
    let options = PostgresOptions {
        connect_timeout: Duration::from_secs(2),
        ..common::options(&schema)
    };
    let store = PostgresClaimStore::connect(&url, options, Default::default())
        .await
        .expect("open through the proxy");
    let a = cell("cell-a");
    let lease = store
        .begin_update(topology_claims_testkit::fixtures::creates(
            &a,
            &[username("before")],
        ))
        .await
        .expect("up");
    store.commit_update(&a, lease.lease_id).await.expect("up");

    proxy.stop().await;
    let down = store
        .begin_update(topology_claims_testkit::fixtures::creates(
            &a,
            &[username("while-down")],
        ))
        .await;
    match down {
        Err(ClaimsError::Unavailable { message }) => {
            assert!(
                message.contains(&proxy.addr.to_string()),
                "the message names the database: {message}"
            );
        }
        other => panic!("a request while PostgreSQL is down must be Unavailable, got {other:?}"),
    }
    assert!(matches!(
        store.lookup_claim(&username("before").key).await,
        Err(ClaimsError::Unavailable { .. })
    ));

    proxy.restart().await;
    let lease = store
        .begin_update(topology_claims_testkit::fixtures::creates(
            &a,
            &[username("after")],
        ))
        .await
        .expect("the store recovers by itself once PostgreSQL is back");
    store
        .commit_update(&a, lease.lease_id)
        .await
        .expect("commit after recovery");
    assert_eq!(
        store
            .lookup_claim(&username("before").key)
            .await
            .expect("kept")
            .cell_id,
        a
    );
    assert!(
        matches!(
            store.lookup_claim(&username("while-down").key).await,
            Err(ClaimsError::ClaimNotFound { .. })
        ),
        "the request that failed left nothing behind"
    );
    proxy.stop().await;
    common::drop_schema(&admin, &schema).await;
}

#[tokio::test]
async fn a_statement_over_the_timeout_fails_unavailable_and_releases_its_locks() {
    let Some(admin) = common::admin().await else {
        return;
    };
    let Some((store, schema)) = common::fresh_store_with(|o| PostgresOptions {
        statement_timeout: Duration::from_millis(200),
        ..o
    })
    .await
    else {
        return;
    };
    let a = cell("cell-a");
    let lease = store
        .begin_update(topology_claims_testkit::fixtures::creates(
            &a,
            &[username("held")],
        ))
        .await
        .unwrap();
    store.commit_update(&a, lease.lease_id).await.unwrap();
    // Another session holds the claim's row lock longer than the statement timeout.
    admin.batch_execute("BEGIN").await.unwrap();
    admin
        .execute(
            &format!("SELECT 1 FROM {schema}.claims WHERE claim_value = 'held' FOR UPDATE"),
            &[],
        )
        .await
        .unwrap();
    let blocked = store
        .begin_update(topology_claims_testkit::fixtures::destroys(
            &a,
            &[username("held")],
        ))
        .await;
    match blocked {
        Err(ClaimsError::Unavailable { message }) => {
            assert!(message.contains("statement timeout"), "{message}")
        }
        other => panic!("expected Unavailable after the statement timeout, got {other:?}"),
    }
    admin.batch_execute("ROLLBACK").await.unwrap();
    let lease = store
        .begin_update(topology_claims_testkit::fixtures::destroys(
            &a,
            &[username("held")],
        ))
        .await
        .expect("the lock is free again and nothing of the timed-out attempt remains");
    store.commit_update(&a, lease.lease_id).await.unwrap();
    common::drop_schema(&admin, &schema).await;
}
