//! The transfer scenarios of issue 13: `first` (a fresh key per request)
//! and `replay` (keys pre-warmed before the rounds) on idem-server, and
//! `baseline` (the same handler and writes without the layer) on the
//! baseline server. Worker `w` acts as caller `w % callers` and moves 1
//! unit back and forth between its own two accounts.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;

use super::headers::{auth, key};
use crate::Result;
use crate::load::{self, Expect, Load, MakeReq, Req};

const PATH: &str = "/v1/transfers";

fn body(caller: usize, forward: bool) -> Bytes {
    let (from, to) = if forward {
        ("main", "savings")
    } else {
        ("savings", "main")
    };
    Bytes::from(format!(
        r#"{{"from":"acc_c{caller}_{from}","to":"acc_c{caller}_{to}","amount":1}}"#
    ))
}

/// `baseline`: no key, on the baseline server.
pub fn baseline(callers: usize) -> MakeReq {
    Arc::new(move |w, n| {
        let c = w % callers;
        Req {
            path: PATH,
            headers: vec![auth(c)],
            body: body(c, n % 2 == 0),
        }
    })
}

/// `first`: a fresh key per request; `tag` makes the keys unique in the
/// session.
pub fn first(callers: usize, tag: u64) -> MakeReq {
    Arc::new(move |w, n| {
        let c = w % callers;
        Req {
            path: PATH,
            headers: vec![auth(c), key(&format!("f{tag}-{w}-{n}"))],
            body: body(c, n % 2 == 0),
        }
    })
}

/// `replay`: the keys [`prewarm`] created, in turn; every answer must be
/// a replay.
pub fn replay(callers: usize, replay_keys: usize) -> (MakeReq, Expect) {
    let make: MakeReq = Arc::new(move |w, n| {
        let c = w % callers;
        let j = (n as usize + w) % replay_keys.max(1);
        Req {
            path: PATH,
            headers: vec![auth(c), key(&format!("warm-{c}-{j}"))],
            body: body(c, true),
        }
    });
    let expect = Expect {
        status: 201,
        replayed: Some(true),
    };
    (make, expect)
}

/// Creates the replay keys (`warm-{caller}-{j}`) with first executions.
pub async fn prewarm(addr: SocketAddr, callers: usize, per_caller: usize) -> Result<()> {
    let make: MakeReq = Arc::new(move |w, n| {
        // Worker w owns caller w and sends its keys 0..per_caller in turn.
        Req {
            path: PATH,
            headers: vec![auth(w), key(&format!("warm-{w}-{n}"))],
            body: body(w, true),
        }
    });
    let r = load::run(Load {
        addr,
        concurrency: callers,
        duration: load::COUNTED_PASS_BOUND,
        max_requests: None,
        make,
        expect: Expect {
            status: 201,
            replayed: None,
        },
        per_worker: Some(per_caller as u64),
    })
    .await;
    if r.errors > 0 {
        return Err(crate::Error::Run(format!(
            "pre-warming replay keys: {}",
            r.first_error.unwrap_or_default()
        )));
    }
    Ok(())
}
