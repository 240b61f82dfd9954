//! What the server shows an operator: Prometheus text at `GET /metrics`,
//! readiness that tells the truth about writes, and the connection metrics.
//!
//! The library's metrics (requests by outcome, store latency and errors,
//! orphaned keys, fence losses, the jobs) are listed in
//! `axum_idempotency::metrics`. The server adds its connections and the
//! process (resident memory, open file descriptors, CPU):
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `idem_server_connections_open` | gauge | | client connections open now |
//! | `idem_server_connections_accepted_total` | counter | | connections accepted |
//! | `idem_server_connections_closed_total` | counter | `reason` | connections ended: `client` (closed by the peer or after its last answer), `error`, and those the server refused to keep: `header_timeout`, `idle_timeout`, `reclaimed_at_cap`, `shutdown` |
//! | `idem_server_connection_cap_reached_total` | counter | | times the server hit its connection cap and stopped accepting (new clients wait in the listen backlog) |
//! | `idem_server_accept_errors_total` | counter | `kind` | failed accepts: `out_of_files`, `other` |
//! | `process_resident_memory_bytes`, `process_open_fds`, `process_cpu_seconds_total`, ... | | | the process, from `metrics-process`, sampled at each scrape |

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum_idempotency::store::KeyStore as _;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::Mutex;

use crate::api::AppState;
use crate::error::{Error, Result};

/// `idem_server_connections_open`.
pub const CONNECTIONS_OPEN: &str = "idem_server_connections_open";
/// `idem_server_connections_accepted_total`.
pub const CONNECTIONS_ACCEPTED: &str = "idem_server_connections_accepted_total";
/// `idem_server_connections_closed_total{reason}`.
pub const CONNECTIONS_CLOSED: &str = "idem_server_connections_closed_total";
/// `idem_server_connection_cap_reached_total`.
pub const CAP_REACHED: &str = "idem_server_connection_cap_reached_total";
/// `idem_server_accept_errors_total{kind}`.
pub const ACCEPT_ERRORS: &str = "idem_server_accept_errors_total";

/// Histogram buckets (seconds) for every histogram: from half a
/// millisecond (a replay on SQLite) to 10 s (a request that waited).
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

struct Exporter {
    handle: PrometheusHandle,
    process: metrics_process::Collector,
}

static EXPORTER: OnceLock<Option<Exporter>> = OnceLock::new();

/// Installs the Prometheus recorder for this process (once; later calls
/// return the same handle). `None` when another recorder was installed
/// first (an embedding application's): then `/metrics` answers 404 and
/// the metrics go to that recorder.
pub fn install() -> Option<&'static PrometheusHandle> {
    EXPORTER
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .inspect_err(|e| tracing::warn!(error = %e, "metrics buckets"))
                .ok()?;
            match builder.install_recorder() {
                Ok(handle) => {
                    axum_idempotency::metrics::describe();
                    for route in crate::app::IDEMPOTENT_ROUTES {
                        axum_idempotency::metrics::describe_route(route);
                    }
                    describe();
                    let process = metrics_process::Collector::default();
                    process.describe();
                    Some(Exporter { handle, process })
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a metrics recorder is already installed; GET /metrics is off");
                    None
                }
            }
        })
        .as_ref()
        .map(|e| &e.handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge};
    metrics::counter!(CAP_REACHED).absolute(0);
    for kind in ["out_of_files", "other"] {
        metrics::counter!(ACCEPT_ERRORS, "kind" => kind).absolute(0);
    }
    for reason in [
        "client",
        "error",
        "header_timeout",
        "idle_timeout",
        "reclaimed_at_cap",
        "shutdown",
    ] {
        metrics::counter!(CONNECTIONS_CLOSED, "reason" => reason).absolute(0);
    }
    describe_gauge!(CONNECTIONS_OPEN, "Client connections open now.");
    describe_counter!(CONNECTIONS_ACCEPTED, "Client connections accepted.");
    describe_counter!(
        CONNECTIONS_CLOSED,
        "Client connections ended, by reason (client, error, header_timeout, idle_timeout, reclaimed_at_cap, shutdown)."
    );
    describe_counter!(
        CAP_REACHED,
        "Times the server reached its connection cap and stopped accepting."
    );
    describe_counter!(
        ACCEPT_ERRORS,
        "Failed accepts, by kind (out_of_files, other)."
    );
}

/// Drains the histograms' pending samples (the exporter's housekeeping),
/// every few seconds, for the life of the server.
pub async fn upkeep() {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Some(Some(e)) = EXPORTER.get() {
            e.handle.run_upkeep();
        }
    }
}

/// `GET /metrics`: Prometheus text exposition (version 0.0.4).
pub async fn metrics_text() -> Response {
    match EXPORTER.get().and_then(Option::as_ref) {
        Some(e) => {
            e.process.collect();
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                e.handle.render(),
            )
                .into_response()
        }
        None => (StatusCode::NOT_FOUND, "metrics are not installed").into_response(),
    }
}

/// A connection accepted.
pub fn connection_opened() {
    metrics::counter!(CONNECTIONS_ACCEPTED).increment(1);
    metrics::gauge!(CONNECTIONS_OPEN).increment(1.0);
}

/// A connection ended, for `reason` (a label value, see the module docs).
pub fn connection_closed(reason: &'static str) {
    metrics::gauge!(CONNECTIONS_OPEN).decrement(1.0);
    metrics::counter!(CONNECTIONS_CLOSED, "reason" => reason).increment(1);
}

/// The server stopped accepting at its cap.
pub fn cap_reached() {
    metrics::counter!(CAP_REACHED).increment(1);
}

/// An accept failed.
pub fn accept_error(out_of_files: bool) {
    let kind = if out_of_files {
        "out_of_files"
    } else {
        "other"
    };
    metrics::counter!(ACCEPT_ERRORS, "kind" => kind).increment(1);
}

/// The last write probe: when, and whether it succeeded. At most one probe
/// runs at a time and its answer is reused for [`PROBE_REUSE`], so a load
/// balancer polling hard costs at most a few small writes a second.
static LAST_PROBE: Mutex<Option<(Instant, bool)>> = Mutex::const_new(None);

/// How long one write probe's answer is reused.
pub const PROBE_REUSE: Duration = Duration::from_millis(250);

/// `GET /readyz`: 200 `{"status":"ready"}` when the store *accepts a
/// write* (one committed upsert of a one-row table, through the same write
/// path and time bound as an idempotent request), else the store's 503
/// `upstream_unavailable` with `Retry-After`. A read alone is not enough:
/// a full disk or a read-only store answers reads while every write fails,
/// and a load balancer must stop sending writes to such an instance.
pub async fn readyz(State(state): State<AppState>) -> Result<axum::Json<serde_json::Value>> {
    let mut last = LAST_PROBE.lock().await;
    if let Some((at, true)) = *last
        && at.elapsed() < PROBE_REUSE
    {
        return Ok(axum::Json(serde_json::json!({"status": "ready"})));
    }
    let probed = probe_write(&state).await;
    *last = Some((Instant::now(), probed.is_ok()));
    drop(last);
    match probed {
        Ok(()) => Ok(axum::Json(serde_json::json!({"status": "ready"}))),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: the store does not accept writes");
            Err(Error::Idempotency(e))
        }
    }
}

/// One committed write to `readiness_probe` (a table of one row).
async fn probe_write(state: &AppState) -> axum_idempotency::Result<()> {
    let store = &state.store;
    let now = state.clock.now_ms();
    let mut tx = store.begin().await?;
    let wrote = axum_idempotency::with_conn!(&mut tx, c => {
        let upsert = if axum_idempotency::store::is_mysql(&*c) {
            "INSERT INTO readiness_probe (id, probed_at) VALUES (1, $1) \
             ON DUPLICATE KEY UPDATE probed_at = $2"
        } else {
            "INSERT INTO readiness_probe (id, probed_at) VALUES (1, $1) \
             ON CONFLICT (id) DO UPDATE SET probed_at = $2"
        };
        sqlx::query(&axum_idempotency::store::sql(&*c, upsert))
        .bind(now)
        .bind(now)
        .execute(&mut *c)
        .await
        .map(|_| ())
    });
    match wrote {
        Ok(_) => store.commit(tx).await,
        Err(e) => {
            let _ = store.rollback(tx).await;
            Err(e.into())
        }
    }
}
