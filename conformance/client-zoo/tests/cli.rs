//! The binary's contract with the kit: exit 0 iff a 2xx, 1 otherwise, 2 when `IDEM_BASE_URL`
//! is missing or the client unknown.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::thread;

const BIN: &str = env!("CARGO_BIN_EXE_idem-client-zoo");

/// Answers every request with `status` on a thread (at most `requests` connections), and
/// returns the base URL.
fn serve(status: u16, requests: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    thread::spawn(move || {
        for stream in listener.incoming().take(requests) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut length = 0usize;
            // Bounded by the head's lines: it ends at the first empty one.
            for line in (&mut reader).lines() {
                let Ok(line) = line else { break };
                if line.is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = std::io::Read::read_exact(&mut reader, &mut body);
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
            );
        }
    });
    base
}

fn run(args: &[&str], base_url: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    // A dead proxy in the environment: the zoo must not use it for the kit's 127.0.0.1.
    cmd.args(args)
        .env_remove("IDEM_BASE_URL")
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("http_proxy", "http://127.0.0.1:9");
    if let Some(url) = base_url {
        cmd.env("IDEM_BASE_URL", url);
    }
    cmd.output().expect("the binary runs")
}

#[test]
fn a_missing_base_url_is_a_usage_error() {
    let out = run(&["--client", "conforming"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("IDEM_BASE_URL is not set"));
}

#[test]
fn an_unknown_client_is_a_usage_error() {
    let out = run(&["--client", "retries-401"], Some("http://127.0.0.1:9"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-jitter"));
}

#[test]
fn exits_0_on_a_2xx_and_1_on_a_final_4xx() {
    for client in ["conforming", "no-key"] {
        let out = run(&["--client", client, "--seed", "3"], Some(&serve(201, 1)));
        assert_eq!(out.status.code(), Some(0), "{client}: {out:?}");
        let out = run(&["--client", client], Some(&serve(422, 1)));
        assert_eq!(out.status.code(), Some(1), "{client}: {out:?}");
    }
}

/// The kit's default success body is `{}`: every client exits 0 on it but
/// exits-1-after-success, whose SDK needs an `id` there: it got its 201 (the server's effect
/// happened) and exits 1.
#[test]
fn exits_1_after_success_exits_1_on_a_201_it_cannot_parse() {
    for client in ["conforming", "key-in-body", "exits-1-after-success"] {
        let out = run(&["--client", client], Some(&serve(201, 2)));
        let want = if client == "exits-1-after-success" {
            1
        } else {
            0
        };
        assert_eq!(out.status.code(), Some(want), "{client}: {out:?}");
    }
    let out = run(&["--client", "exits-1-after-success"], Some(&serve(201, 1)));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("could not parse"),
        "{out:?}"
    );
}
