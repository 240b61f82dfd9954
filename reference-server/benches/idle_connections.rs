//! What idle connections cost the server, and what the connection limits
//! give back: the server's resident memory (VmRSS) and open sockets with
//! many silent connections and many idle keep-alive ones, before and after
//! the header and idle timeouts, and the request rate over a few
//! kept-alive connections (the per-connection watchdog is on that path).
//!
//! `cargo bench -p idem-server --bench idle_connections` runs it against
//! this build. To compare with another build (e.g. one from before the
//! limits), point `IDEM_SERVER_BIN` at its binary; `IDEM_BENCH_SOCKETS`
//! sets how many connections to open (default 5000, 0 for the request
//! rate alone; the bench needs that many file descriptors, and so does the
//! server). Linux only: it reads
//! `/proc`. Figures are printed, never asserted.
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use idem_test_support::{ChildServer, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: b\r\n\r\n";

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits (at most `within`) until the server holds at least `n` sockets or
/// the count stops moving; returns the count.
async fn settle(pid: u32, n: usize, within: Duration) -> usize {
    let end = Instant::now() + within;
    let mut last = usize::MAX;
    let mut still = 0;
    loop {
        let now = sockets(pid);
        if now >= n || Instant::now() >= end {
            return now;
        }
        still = if now == last { still + 1 } else { 0 };
        if still >= 10 {
            return now;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn one_request(s: &mut TcpStream) -> bool {
    if s.write_all(HEALTHZ).await.is_err() {
        return false;
    }
    let mut buf = vec![0u8; 1024];
    let mut got = 0;
    // The healthz answer is small: read until its body has arrived.
    while got < 4 || !buf[..got].ends_with(b"}") {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf[got..])).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return false,
            Ok(Ok(n)) => got += n,
        }
        if got == buf.len() {
            return false;
        }
    }
    true
}

fn row(what: &str, pid: u32, base_rss: u64, base_sockets: usize) {
    let rss = rss_kib(pid);
    let s = sockets(pid);
    println!(
        "{what:<52} {:>8.1} MiB {:>+9.1} MiB {:>7} sockets",
        rss as f64 / 1024.0,
        (rss as f64 - base_rss as f64) / 1024.0,
        s.saturating_sub(base_sockets)
    );
}

#[tokio::main]
async fn main() {
    let bin = std::env::var("IDEM_SERVER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_idem-server").to_owned());
    let n: usize = std::env::var("IDEM_BENCH_SOCKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let dir = TempDir::new("idem-bench-idle");
    let url = format!("sqlite://{}", dir.join("idem.db").display());
    let server = ChildServer::command(&bin)
        .args(["--listen", "127.0.0.1:0", "--database-url", &url])
        .start()
        .await
        .expect("start the server");
    let pid = server.pid().unwrap();
    let addr = server.addr();
    println!("server: {bin}\nconnections: {n}\n");

    // Requests per second over 8 kept-alive connections, 2 s.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let mut done = 0u64;
            while started.elapsed() < Duration::from_secs(2) && one_request(&mut s).await {
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base_rss = rss_kib(pid);
    let base_sockets = sockets(pid);
    println!("GET /healthz over 8 kept-alive connections: {rate:.0} requests/s\n");
    if n == 0 {
        return;
    }
    println!(
        "{:<52} {:>12} {:>13} {:>15}",
        "", "VmRSS", "over idle", "held"
    );
    row("idle server", pid, base_rss, base_sockets);

    let mut silent = Vec::with_capacity(n);
    for _ in 0..n {
        match TcpStream::connect(addr).await {
            Ok(s) => silent.push(s),
            Err(_) => break,
        }
    }
    settle(pid, base_sockets + silent.len(), Duration::from_secs(5)).await;
    row(
        &format!("{} connections that never send a byte", silent.len()),
        pid,
        base_rss,
        base_sockets,
    );
    // Past the default header timeout (10 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    row("  12 s later", pid, base_rss, base_sockets);
    drop(silent);
    settle(pid, 0, Duration::from_secs(3)).await;

    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            break;
        };
        if one_request(&mut s).await {
            idle.push(s);
        }
    }
    settle(pid, base_sockets + idle.len(), Duration::from_secs(5)).await;
    row(
        &format!("{} kept-alive connections after one request", idle.len()),
        pid,
        base_rss,
        base_sockets,
    );
    // Past the default idle timeout (60 s).
    tokio::time::sleep(Duration::from_secs(62)).await;
    row("  62 s later", pid, base_rss, base_sockets);
    drop(idle);
}
