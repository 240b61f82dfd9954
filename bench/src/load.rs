//! The load generator: `concurrency` workers, each on its own kept-alive
//! HTTP/1.1 connection (hyper's client, no pool), sending one request after
//! another until the cell's deadline or request budget.
//!
//! Closed loop on purpose: a worker sends its next request when the last
//! answer arrived, so the concurrency is exactly the number of requests in
//! flight, and the throughput is what the server sustains at that
//! concurrency (not an offered rate it may fall behind).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{HeaderName, HeaderValue};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpStream;

/// One request to send: path, extra headers, JSON body.
#[derive(Debug, Clone)]
pub struct Req {
    /// Path (and query).
    pub path: &'static str,
    /// Headers besides Host, Content-Type and Content-Length.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The JSON body.
    pub body: Bytes,
}

/// Builds worker `w`'s request number `n` (fresh keys, replayed keys, none).
pub type MakeReq = Arc<dyn Fn(usize, u64) -> Req + Send + Sync>;

/// What a good answer is: the status, and whether it must (or must not)
/// say `Idempotent-Replayed: true`.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// Expected status code.
    pub status: u16,
    /// `Some(true)`: must be a replay; `Some(false)`: must not; `None`: either.
    pub replayed: Option<bool>,
}

/// One load cell: where, how many at once, for how long.
#[derive(Clone)]
pub struct Load {
    /// The server.
    pub addr: SocketAddr,
    /// Workers (= connections = requests in flight).
    pub concurrency: usize,
    /// Stop sending after this long.
    pub duration: Duration,
    /// Stop sending after this many requests (all workers together).
    pub max_requests: Option<u64>,
    /// Stop each worker after this many requests of its own.
    pub per_worker: Option<u64>,
    /// The requests.
    pub make: MakeReq,
    /// What counts as success.
    pub expect: Expect,
}

/// What one cell measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadResult {
    /// Answers as expected.
    pub ok: u64,
    /// Other answers, transport errors and reconnects.
    pub errors: u64,
    /// First unexpected answer or error, for the report.
    pub first_error: Option<String>,
    /// From the first send to the last answer, seconds.
    pub elapsed_s: f64,
    /// `ok / elapsed_s`.
    pub throughput: f64,
    /// Median latency of good answers, ms.
    pub p50_ms: f64,
    /// 99th percentile latency of good answers, ms.
    pub p99_ms: f64,
}

/// The time bound of a pass that stops by its count of requests
/// (`max_requests` or `per_worker`): never reached by a healthy run, it only
/// ends a stalled one.
pub const COUNTED_PASS_BOUND: Duration = Duration::from_secs(60);

/// Most reconnects one worker tries before it gives up on the cell.
const MAX_RECONNECTS: u32 = 5;
/// Hard bound on a cell, whatever its duration says.
const MAX_CELL: Duration = Duration::from_secs(120);

struct Worker {
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_us: Vec<u32>,
}

/// Runs the cell to its end and returns what it measured.
pub async fn run(load: Load) -> LoadResult {
    let start = Instant::now();
    let deadline = start + load.duration.min(MAX_CELL);
    let budget = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(load.concurrency);
    for w in 0..load.concurrency {
        let load = load.clone();
        let budget = budget.clone();
        tasks.push(tokio::spawn(async move {
            worker(w, &load, deadline, &budget).await
        }));
    }
    let mut all = Vec::new();
    let mut out = LoadResult::default();
    for t in tasks {
        match t.await {
            Ok(w) => {
                out.ok += w.ok;
                out.errors += w.errors;
                if out.first_error.is_none() {
                    out.first_error = w.first_error;
                }
                all.extend(w.latencies_us);
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    out.elapsed_s = start.elapsed().as_secs_f64();
    out.throughput = if out.elapsed_s > 0.0 {
        out.ok as f64 / out.elapsed_s
    } else {
        0.0
    };
    all.sort_unstable();
    out.p50_ms = percentile(&all, 0.50);
    out.p99_ms = percentile(&all, 0.99);
    out
}

/// The `q` quantile (nearest rank) of sorted microseconds, in ms.
pub fn percentile(sorted_us: &[u32], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    f64::from(sorted_us[rank - 1]) / 1000.0
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Sender, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// `GET path` on a fresh connection, bounded by 10 s: the body of a 200.
pub async fn get(addr: SocketAddr, path: &str) -> Result<Bytes, String> {
    let fetch = async {
        let mut s = connect(addr).await?;
        let req = Request::get(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let resp = s.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if status != hyper::StatusCode::OK {
            return Err(format!("{path} answered {status}"));
        }
        Ok(body)
    };
    tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| format!("{path}: no answer within 10 s"))?
}

async fn worker(w: usize, load: &Load, deadline: Instant, budget: &AtomicU64) -> Worker {
    let mut out = Worker {
        ok: 0,
        errors: 0,
        first_error: None,
        latencies_us: Vec::with_capacity(4096),
    };
    let host =
        HeaderValue::from_str(&load.addr.to_string()).unwrap_or(HeaderValue::from_static("b"));
    let json = HeaderValue::from_static("application/json");
    let mut reconnects = 0;
    let mut sender = None;
    let mut n = 0u64;
    loop {
        if Instant::now() >= deadline {
            break;
        }
        if load.per_worker.is_some_and(|p| n >= p) {
            break;
        }
        if let Some(max) = load.max_requests
            && budget.fetch_add(1, Ordering::Relaxed) >= max
        {
            break;
        }
        let s = match &mut sender {
            Some(s) => s,
            None => match connect(load.addr).await {
                Ok(s) => sender.insert(s),
                Err(e) => {
                    out.errors += 1;
                    out.first_error.get_or_insert(format!("connect: {e}"));
                    reconnects += 1;
                    if reconnects > MAX_RECONNECTS {
                        break;
                    }
                    continue;
                }
            },
        };
        let r = (load.make)(w, n);
        n += 1;
        let mut builder = Request::post(r.path)
            .header(hyper::header::HOST, host.clone())
            .header(hyper::header::CONTENT_TYPE, json.clone());
        for (k, v) in r.headers {
            builder = builder.header(k, v);
        }
        let Ok(req) = builder.body(Full::new(r.body)) else {
            out.errors += 1;
            break;
        };
        let sent = Instant::now();
        let result = async {
            s.ready().await.map_err(|e| e.to_string())?;
            let resp = s.send_request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let replayed = resp
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((status, replayed, body.to_bytes()))
        }
        .await;
        match result {
            Ok((status, replayed, body)) => {
                let good = status == load.expect.status
                    && load.expect.replayed.is_none_or(|want| want == replayed);
                if good {
                    out.ok += 1;
                    let us = sent.elapsed().as_micros();
                    out.latencies_us.push(u32::try_from(us).unwrap_or(u32::MAX));
                } else {
                    out.errors += 1;
                    out.first_error.get_or_insert_with(|| {
                        format!(
                            "{} answered {status} (replayed: {replayed}): {}",
                            r.path,
                            String::from_utf8_lossy(&body[..body.len().min(300)])
                        )
                    });
                }
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert(format!("request: {e}"));
                sender = None;
                reconnects += 1;
                if reconnects > MAX_RECONNECTS {
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_rank_in_milliseconds() {
        let v: Vec<u32> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[7000], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
