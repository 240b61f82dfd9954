//! The list endpoints are safe to copy: bounded pages with a stable
//! cursor, `count` of everything matching, indexed filters.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;

use axum::http::StatusCode;
use axum_idempotency::{Store, with_pool};
use support::{Backend, app, both, db, get, move_body, send, transfer};

/// Makes `n` transfers for alice, with memo `memo` on every third one.
async fn seed(router: &axum::Router, n: usize, memo: &str) {
    for i in 0..n {
        let body = if i % 3 == 0 {
            format!(
                r#"{{"from":"acc_alice_main","to":"acc_alice_savings","amount":1,"memo":"{memo}"}}"#
            )
        } else {
            move_body("alice", 1)
        };
        let r = send(
            router,
            transfer("demo-alice", Some(&format!("k{i}")), &body),
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    }
}

/// Walks every page of `path` (with `?` already in it or not), returning
/// the ids in order and the `count` each page reported.
async fn walk(router: &axum::Router, path: &str, items: &str) -> (Vec<String>, BTreeSet<u64>) {
    let mut ids = Vec::new();
    let mut counts = BTreeSet::new();
    let mut cursor: Option<String> = None;
    let sep = if path.contains('?') { '&' } else { '?' };
    for _ in 0..100 {
        let url = match &cursor {
            Some(c) => format!("{path}{sep}cursor={c}"),
            None => path.to_owned(),
        };
        let r = send(router, get("demo-alice", &url)).await;
        assert_eq!(r.status, StatusCode::OK, "{url}: {:?}", r.body);
        let v = r.json();
        counts.insert(v["count"].as_u64().unwrap());
        for t in v[items].as_array().unwrap() {
            ids.push(
                t["id"]
                    .as_str()
                    .or(t["payment_id"].as_str())
                    .unwrap()
                    .to_owned(),
            );
        }
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => {
                assert!(v["next_cursor"].is_null(), "next_cursor is always present");
                return (ids, counts);
            }
        }
    }
    panic!("more than 100 pages");
}

async fn transfer_ids_in_db(store: &Store, memo: Option<&str>) -> Vec<String> {
    with_pool!(store, p => {
        let sql = match memo {
            Some(_) => "SELECT id FROM transfers WHERE owner = 'alice' AND memo = $1 ORDER BY created_at, id",
            None => "SELECT id FROM transfers WHERE owner = 'alice' ORDER BY created_at, id",
        };
        let text = axum_idempotency::store::sql(p, sql);
        let mut q = sqlx::query_scalar::<_, String>(&text);
        if let Some(m) = memo {
            q = q.bind(m);
        }
        q.fetch_all(p).await.unwrap()
    })
}

async fn transfers_come_in_bounded_pages_that_cover_every_item_once(b: Backend) {
    let db = db!(b, "pages");
    let app = app(&db, &[]).await;
    let r = &app.router;
    seed(r, 62, "probe-7").await;

    // The default page is 50, and count is every matching item.
    let first = send(r, get("demo-alice", "/v1/transfers")).await.json();
    assert_eq!(first["transfers"].as_array().unwrap().len(), 50);
    assert_eq!(first["count"], 62);
    assert!(first["next_cursor"].is_string());

    // Small pages walk all 62 in the database's order, each exactly once.
    let (ids, counts) = walk(r, "/v1/transfers?limit=7", "transfers").await;
    assert_eq!(ids, transfer_ids_in_db(&app.state.store, None).await);
    assert_eq!(counts, BTreeSet::from([62]));

    // A filter pages too, and count is what matches it (the effect probe).
    let (ids, counts) = walk(r, "/v1/transfers?memo=probe-7&limit=5", "transfers").await;
    assert_eq!(ids.len(), 21);
    assert_eq!(
        ids,
        transfer_ids_in_db(&app.state.store, Some("probe-7")).await
    );
    assert_eq!(counts, BTreeSet::from([21]));

    // A page ending exactly at the last item says there is no next one.
    let all = send(r, get("demo-alice", "/v1/transfers?limit=200"))
        .await
        .json();
    assert_eq!(all["transfers"].as_array().unwrap().len(), 62);
    assert!(all["next_cursor"].is_null());

    // Items created after a cursor was handed out appear on a later page;
    // none already seen repeats.
    let page = send(r, get("demo-alice", "/v1/transfers?limit=60"))
        .await
        .json();
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    seed_more(r, 3).await;
    let rest = send(
        r,
        get(
            "demo-alice",
            &format!("/v1/transfers?limit=60&cursor={cursor}"),
        ),
    )
    .await
    .json();
    assert_eq!(rest["transfers"].as_array().unwrap().len(), 5);
    assert_eq!(rest["count"], 65);

    // Another caller sees none of it, with or without alice's cursor.
    let bob = send(
        r,
        get("demo-bob", &format!("/v1/transfers?cursor={cursor}")),
    )
    .await
    .json();
    assert_eq!(bob["count"], 0);
    assert_eq!(bob["transfers"].as_array().unwrap().len(), 0);
    app.state.store.close().await;
}
both!(transfers_come_in_bounded_pages_that_cover_every_item_once);

async fn seed_more(router: &axum::Router, n: usize) {
    for i in 0..n {
        let r = send(
            router,
            transfer(
                "demo-alice",
                Some(&format!("more{i}")),
                &move_body("alice", 1),
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
}

async fn bad_list_parameters_are_problems_not_everything(b: Backend) {
    let db = db!(b, "listbad");
    let app = app(&db, &[]).await;
    let r = &app.router;
    seed(r, 3, "m").await;
    let receipts_cursor = send(r, get("demo-alice", "/v1/receipts")).await;
    assert_eq!(receipts_cursor.status, StatusCode::OK);
    let foreign = hex_cursor("payments:0:pay_x");
    for url in [
        "/v1/transfers?limit=0",
        "/v1/transfers?limit=201",
        "/v1/transfers?limit=ten",
        "/v1/transfers?cursor=nothex",
        &format!("/v1/transfers?cursor={foreign}"),
        // A misspelt filter must not silently answer the unfiltered list.
        "/v1/transfers?mem=m",
        "/v1/payments?idempotency_kye=k",
        "/v1/payments?limit=500",
        "/v1/receipts?cursor=00",
        "/v1/receipts?page=2",
    ] {
        let resp = send(r, get("demo-alice", url)).await;
        assert_eq!(resp.status, StatusCode::UNPROCESSABLE_ENTITY, "{url}");
        assert_eq!(resp.problem_code(), "validation_failed", "{url}");
    }
    app.state.store.close().await;
}
both!(bad_list_parameters_are_problems_not_everything);

fn hex_cursor(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The query plan of `sql` (bound to alice and `arg`) names `index`.
async fn uses_index(store: &Store, sql: &str, arg: &str, index: &str) -> String {
    let plan: Vec<String> = match store {
        Store::Sqlite(s) => {
            sqlx::query_as::<_, (i64, i64, i64, String)>(&format!("EXPLAIN QUERY PLAN {sql}"))
                .bind("alice")
                .bind(arg)
                .fetch_all(s.pool())
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.3)
                .collect()
        }
        Store::Postgres(s) => {
            let mut c = s.pool().acquire().await.unwrap();
            // A handful of rows: the planner would rightly scan the table;
            // forbid that to see which index it can use.
            sqlx::query("SET enable_seqscan = off")
                .execute(&mut *c)
                .await
                .unwrap();
            let plan = sqlx::query_scalar::<_, String>(&format!("EXPLAIN {sql}"))
                .bind("alice")
                .bind(arg)
                .fetch_all(&mut *c)
                .await
                .unwrap();
            sqlx::query("RESET enable_seqscan")
                .execute(&mut *c)
                .await
                .unwrap();
            plan
        }
        Store::MySql(s) => {
            // EXPLAIN names the indexes the planner could use for each table
            // (`possible_keys`); on a handful of rows it may rightly pick
            // none, as PostgreSQL would without enable_seqscan = off.
            use sqlx::Row;
            let mysql_sql = sql.replace("AS BIGINT", "AS SIGNED");
            let text = axum_idempotency::store::sql(s.pool(), &mysql_sql);
            let rows = sqlx::query(&format!("EXPLAIN {text}"))
                .bind("alice")
                .bind(arg)
                .fetch_all(s.pool())
                .await
                .unwrap();
            rows.iter()
                .map(|r| {
                    r.try_get::<Option<String>, _>("possible_keys")
                        .or_else(|_| {
                            r.try_get::<Option<Vec<u8>>, _>("possible_keys")
                                .map(|b| b.map(|b| String::from_utf8_lossy(&b).into_owned()))
                        })
                        .unwrap()
                        .unwrap_or_default()
                })
                .collect()
        }
        _ => panic!("a store this test does not know"),
    };
    let plan = plan.join("\n");
    assert!(plan.contains(index), "{sql}\nexpected {index}:\n{plan}");
    plan
}

async fn every_list_filter_has_an_index(b: Backend) {
    let db = db!(b, "listidx");
    let app = app(&db, &[]).await;
    let s = &app.state.store;
    seed(&app.router, 3, "m").await;
    uses_index(
        s,
        "SELECT id FROM transfers WHERE owner = $1 AND memo = $2 ORDER BY created_at, id LIMIT 51",
        "m",
        "transfers_owner_memo",
    )
    .await;
    uses_index(
        s,
        "SELECT COUNT(*) FROM transfers WHERE owner = $1 AND memo = $2",
        "m",
        "transfers_owner_memo",
    )
    .await;
    uses_index(
        s,
        "SELECT id FROM transfers WHERE owner = $1 AND created_at >= 0 AND (created_at > 0 OR id > $2) ORDER BY created_at, id LIMIT 51",
        "tr_0",
        "transfers_owner_page",
    )
    .await;
    uses_index(
        s,
        "SELECT id FROM payments WHERE owner = $1 AND idempotency_key = $2 ORDER BY created_at, id LIMIT 51",
        "k",
        "payments_owner_key",
    )
    .await;
    uses_index(
        s,
        "SELECT id FROM payments WHERE owner = $1 AND description = $2 ORDER BY created_at, id LIMIT 51",
        "d",
        "payments_owner_description",
    )
    .await;
    uses_index(
        s,
        "SELECT job_id FROM receipts WHERE owner = $1 AND job_id > CAST($2 AS BIGINT) ORDER BY job_id LIMIT 51",
        "0",
        "receipts_owner",
    )
    .await;
    app.state.store.close().await;
}
both!(every_list_filter_has_an_index);
