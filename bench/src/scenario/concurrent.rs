//! The timed concurrency scenario (issue 19 item 1): `requests` first
//! executions sent at once on their own connections, distinct keys and
//! callers, whose handler spends `sleep_ms` before its first write; then
//! their effects are counted in the database itself, not asked of the app.

use std::sync::Arc;

use super::headers::{key, user};
use super::minimal::note;
use crate::Result;
use crate::apps::Dbs;
use crate::child::ChildServer;
use crate::config::Config;
use crate::load::{self, Expect, Load, MakeReq, Req};
use crate::results::Concurrent;

/// The scenario once: `cfg.concurrent_requests` workers each send one
/// request to `/idem/slow` (or `/plain/slow`) at once, with their own key
/// and caller; then the effects are counted in the database at `url`.
pub async fn run(
    cfg: &Config,
    app: &ChildServer,
    (dbs, url): (&Dbs, &str),
    layer: bool,
    pool: u32,
    tag: u64,
) -> Result<Concurrent> {
    let prefix = format!("c{tag}-");
    let p = prefix.clone();
    let make: MakeReq = Arc::new(move |w, _| {
        let id = format!("{p}{w}");
        let mut headers = vec![user(&format!("cc{tag}-{w}"))];
        if layer {
            headers.push(key(&id));
        }
        Req {
            path: if layer { "/idem/slow" } else { "/plain/slow" },
            headers,
            body: note(&id),
        }
    });
    let r = load::run(Load {
        addr: app.addr,
        concurrency: cfg.concurrent_requests,
        duration: load::COUNTED_PASS_BOUND,
        max_requests: None,
        per_worker: Some(1),
        make,
        expect: Expect {
            status: 201,
            replayed: Some(false),
        },
    })
    .await;
    let (effects, distinct_effects) = effects(dbs, url, &prefix).await?;
    Ok(Concurrent {
        layer,
        requests: cfg.concurrent_requests,
        sleep_ms: cfg.concurrent_sleep_ms,
        pool,
        created: r.ok,
        errors: r.errors,
        first_error: r.first_error,
        elapsed_s: r.elapsed_s,
        p50_ms: r.p50_ms,
        p99_ms: r.p99_ms,
        effects,
        distinct_effects,
    })
}

/// The progress line of one run.
pub fn line(kind: crate::config::StoreKind, r: &Concurrent) -> String {
    format!(
        "{kind} concurrent {} x {} ms {} the layer (pool {}): {:.2} s, {} created, {} errors, {} effects ({} distinct){}",
        r.requests,
        r.sleep_ms,
        if r.layer { "with" } else { "without" },
        r.pool,
        r.elapsed_s,
        r.created,
        r.errors,
        r.effects,
        r.distinct_effects,
        r.first_error
            .as_deref()
            .map_or(String::new(), |e| format!(": {e}"))
    )
}

/// Rows of the minimal app's `notes` whose text starts with `prefix`, and
/// how many distinct texts they hold.
async fn effects(dbs: &Dbs, url: &str, prefix: &str) -> Result<(u64, u64)> {
    use sqlx::Connection;
    use std::str::FromStr;
    let q = "SELECT count(*), count(DISTINCT text) FROM notes WHERE text LIKE $1";
    let pattern = format!("{prefix}%");
    let (a, b): (i64, i64) = match dbs {
        Dbs::Sqlite { .. } => {
            let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)?.read_only(true);
            let mut c = sqlx::SqliteConnection::connect_with(&opts).await?;
            let r = sqlx::query_as(q).bind(&pattern).fetch_one(&mut c).await?;
            c.close().await.ok();
            r
        }
        Dbs::Postgres { .. } => {
            let mut c = sqlx::PgConnection::connect(url).await?;
            let r = sqlx::query_as(q).bind(&pattern).fetch_one(&mut c).await?;
            c.close().await.ok();
            r
        }
        Dbs::MySql(_) => {
            let mut c = sqlx::MySqlConnection::connect(url).await?;
            let r = sqlx::query_as(&q.replace("$1", "?"))
                .bind(&pattern)
                .fetch_one(&mut c)
                .await?;
            c.close().await.ok();
            r
        }
    };
    Ok((u64::try_from(a).unwrap_or(0), u64::try_from(b).unwrap_or(0)))
}
