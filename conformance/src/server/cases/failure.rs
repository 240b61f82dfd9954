//! The failure-policy family: 4xx outcomes are final and replayed, 5xx
//! outcomes are never stored and release the key, and answers decided
//! before the claim leave the key free.
//!
//! A final outcome executed again, or a 5xx stored and replayed, breaks
//! the failure policy (`semantics` by the severity rule: the answer is true
//! about effects). Only a count of handler runs (`hooks.execution_probe`)
//! or the replay marker can show either, because the repeated answer may be
//! byte-identical; identical bytes alone are never taken as a stored
//! answer. Without that evidence the kit judges what it can see (the
//! answer is not the stored one, the key was not released) and says what
//! it could not.

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;
use idem_spec::report::Verdict;

use super::{check_replay, preview};
use crate::server::case::{Aim, Case, Need, Rec, shared};
use crate::server::http::Response;
use crate::server::manifest::ManifestExt;

/// `failure.5xx-not-stored` runs with either way of provoking a 5xx.
const SERVER_ERROR: Need = Need {
    what: "hooks.failpoint.server_error or endpoints[0].server_error_body",
    declared: |m, _| {
        m.endpoints[0].server_error_body.is_some()
            || m.hooks
                .failpoint
                .as_ref()
                .is_some_and(|f| f.server_error.is_some())
    },
};

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "failure.4xx-final",
            title: "a 4xx outcome after the claim is stored and replayed",
            clauses: &[
                clause!("idem.failure.final-outcomes"),
                clause!("idem.replay.verbatim"),
                clause!("idem.replay.marker"),
            ],
            needs: &[Need::REJECTED_BODY],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "R1: a 4xx; R2: the same 4xx, byte for byte, with {}; with an execution probe, one handler run",
                    m.marker_spelled()
                )]
            },
            run: |r| Box::pin(final_4xx(r)),
        },
        Case {
            id: "failure.5xx-not-stored",
            title: "a 5xx is not stored: the same key afterwards executes",
            clauses: &[
                clause!("idem.failure.5xx-not-stored"),
                clause!("idem.claim.transactional"),
            ],
            needs: &[SERVER_ERROR],
            aim: Aim::Main,
            alone: shared,
            permitted: |_| {
                vec![
                    "failpoint: R1 (fault injected): a 5xx and no effect; R2 (same key, no fault): a fresh 2xx, one effect".into(),
                    "server_error_body: R1: a 5xx; R2 (same key and body): a 5xx executed again, not replayed; R3 (same key, the endpoint's body): a fresh 2xx".into(),
                ]
            },
            run: |r| Box::pin(not_stored_5xx(r)),
        },
        Case {
            id: "failure.before-claim",
            title: "a body refused for its size is refused before the claim: the key stays free",
            clauses: &[clause!("idem.failure.before-claim")],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |_| {
                vec![format!(
                    "R1 (declaring Content-Length: {DECLARED_LENGTH}): 413 (or 408/429); R2 (same key, the plain body): a fresh 2xx, not a replay and not a mismatch, one effect"
                )]
            },
            run: |r| Box::pin(before_claim(r)),
        },
    ]
}

async fn final_4xx(rec: &mut Rec) {
    let declared = rec.ctx.manifest.policy.failure_policy.clone();
    let Some(template) = rec.ctx.endpoint().rejected_body.clone() else {
        return;
    };
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let marker = rec.ctx.marker();
    let body =
        crate::server::manifest::expand(&template, rec.ctx.caller(0), &marker, rec.ctx.amount());
    let req = rec.ctx.op(0, Some(&key), &marker, &body);
    let Some(r1) = rec
        .send(
            &format!("{name} sends the declared rejected body with {a}"),
            &req,
        )
        .await
    else {
        return;
    };
    if !(400..500).contains(&r1.status) {
        rec.stop(
            Verdict::Inconclusive,
            format!(
                "endpoints[0].rejected_body did not produce a 4xx: {} {}",
                r1.status,
                preview(&r1.body)
            ),
        );
        return;
    }
    // The contract's policy is what the case judges; a declared other one
    // only tells the reader what to expect.
    if !declared.stores(r1.status) {
        rec.note(format!(
            "the manifest declares failure_policy = {}: a {} is not stored, so its retry executes again; the contract requires a final 4xx stored, and the case checks the contract",
            declared.describe(),
            r1.status
        ));
    }
    let Some(r2) = rec.send(&format!("{name} resends it with {a}"), &req).await else {
        return;
    };
    // A final 4xx that now succeeds was executed again: the caller was told
    // "no", then the operation happened, once, and the retry's answer says
    // so. By the severity rule that is semantics: nothing took effect twice
    // and nobody was told something false about effects.
    rec.check_as(
        clause!("idem.failure.final-outcomes"),
        Consequence::Behaviour,
        !rec.ctx.dialect().executed(&r2, Some(&r1)),
        format!("the {} is final: never executed again", r1.status),
        r2.summary(),
    );
    rec.headline(format!(
        "a final {} executed again on retry and succeeded: R1 {}, R2 {}{}",
        r1.status,
        r1.summary(),
        r2.summary(),
        rec.ctx
            .dialect()
            .resource_id(&r2)
            .map_or(String::new(), |id| format!(" (created {id})"))
    ));
    rec.check_as(
        clause!("idem.failure.final-outcomes"),
        Consequence::Behaviour,
        r2.same_outcome(&r1),
        format!("the {} is final: replayed", r1.status),
        r2.summary(),
    );
    check_replay(rec, &r1, &r2, "R2");
    if rec
        .check_executions_as(
            clause!("idem.failure.final-outcomes"),
            Consequence::Behaviour,
            &marker,
            1,
            &format!("a final {} retried with its key", r1.status),
        )
        .await
        .is_none()
        && rec.stopped.is_none()
    {
        rec.note(
            "no hooks.execution_probe: a 4xx executed again with the same answer cannot be told from a replay",
        );
    }
}

/// Whether `r1` is the declared server error: a 5xx that is not a status
/// the manifest lists for an unsupported route or method, nor shed load
/// (503 with Retry-After), and, when an execution probe is declared, one
/// the handler ran for. Otherwise the case stops inconclusive: what
/// follows would be judged on an answer the case did not confirm.
async fn confirm_server_error(rec: &mut Rec, r1: &Response, marker: &str, what: &str) -> bool {
    let why = if r1.status < 500 {
        Some("not a 5xx".to_owned())
    } else if rec.ctx.manifest.unsupported(r1.status) {
        Some(format!(
            "{} is a status the manifest lists in profile.unsupported_statuses (a route or method the target does not serve), not a failure after the claim",
            r1.status
        ))
    } else if r1.status == 503 && r1.header("retry-after").is_some() {
        Some("503 with Retry-After: shed load, not a failure after the claim".to_owned())
    } else {
        None
    };
    if let Some(why) = why {
        rec.stop(
            Verdict::Inconclusive,
            format!(
                "{what} did not produce the declared server error ({}): {why}",
                r1.summary()
            ),
        );
        return false;
    }
    match rec.ctx.executions(marker).await {
        Some(Ok(0)) => {
            rec.stop(
                Verdict::Inconclusive,
                format!(
                    "{what} was answered {} but hooks.execution_probe counted no handler run: the request failed before its key was claimed, so there is no stored 5xx to look for",
                    r1.status
                ),
            );
            false
        }
        Some(Ok(n)) => {
            rec.note(format!(
                "the execution probe counted {n} handler run(s): the 5xx came after the claim"
            ));
            true
        }
        Some(Err(e)) => {
            rec.probe_failed(e);
            false
        }
        None => true,
    }
}

async fn not_stored_5xx(rec: &mut Rec) {
    let declared = &rec.ctx.manifest.policy.failure_policy;
    if (500..600).any(|s| declared.stores(s)) {
        let d = declared.describe();
        rec.note(format!(
            "the manifest declares failure_policy = {d}, which stores a 5xx where the contract does not; the case checks the contract"
        ));
    }
    if rec.ctx.failpoint(|f| f.server_error.as_ref()).is_some() {
        by_failpoint(rec).await;
        if rec.stopped.is_some() {
            return;
        }
    }
    if rec.ctx.endpoint().server_error_body.is_some() {
        by_body(rec).await;
    }
}

async fn by_failpoint(rec: &mut Rec) {
    let Some((header, value)) = rec.ctx.failpoint(|f| f.server_error.as_ref()) else {
        return;
    };
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&key), &marker, &body);
    let faulty = req.clone().header(&header, &value);
    let Some(r1) = rec
        .send(
            &format!("{name} sends with {a} and {header}: {value}"),
            &faulty,
        )
        .await
    else {
        return;
    };
    if !confirm_server_error(rec, &r1, &marker, "the server_error failpoint").await {
        return;
    }
    rec.check_effects(
        clause!("idem.claim.transactional"),
        0,
        &marker,
        &[&r1],
        0,
        "the failed attempt committed nothing",
    )
    .await;
    let Some(r2) = rec
        .send(&format!("{name} retries with {a}, no fault"), &req)
        .await
    else {
        return;
    };
    retry_after_5xx(rec, &r1, &r2, &marker).await;
}

/// R2, the retry after R1's 5xx with the endpoint's own body: a fresh
/// execution. The 5xx replayed and the key still held are both semantics
/// (the retry is told, truly, that nothing took effect).
///
/// A retry answered with the same bytes as R1 is not proof of a stored
/// answer: the retry may have run and failed the same way. Only the replay
/// marker, or a count of handler runs, can tell the two apart; without
/// either the kit does not judge it stored.
async fn retry_after_5xx(rec: &mut Rec, r1: &Response, r2: &Response, marker: &str) {
    let marked = r2.status >= 500 && (rec.ctx.manifest.marked(r2) == Some(true) || r2.replayed());
    let stored = if marked || !r2.same_outcome(r1) {
        Some(marked)
    } else {
        match rec.ctx.executions(marker).await {
            Some(Ok(n)) => {
                rec.note(format!(
                    "R2 repeats R1's {} byte for byte; the execution probe counted {n} handler run(s), so it was {}",
                    r1.status,
                    if n >= 2 { "a fresh failure" } else { "answered from the store" }
                ));
                Some(n < 2)
            }
            Some(Err(e)) => {
                rec.probe_failed(e);
                return;
            }
            None => {
                rec.note(format!(
                    "R2 repeats R1's {} byte for byte without a replay marker: a stored answer and a fresh failure look the same, and no hooks.execution_probe counts runs, so it is not judged stored",
                    r1.status
                ));
                None
            }
        }
    };
    if let Some(stored) = stored {
        rec.check(
            clause!("idem.failure.5xx-not-stored"),
            !stored,
            "the retry is not answered with the stored 5xx",
            r2.summary(),
        );
        rec.headline(format!(
            "a {} was stored and replayed to the retry: R1 {} and the retry {}",
            r1.status,
            r1.summary(),
            r2.summary(),
        ));
    }
    rec.check_as(
        clause!("idem.failure.5xx-not-stored"),
        Consequence::Behaviour,
        rec.ctx.dialect().executed(r2, None),
        "a fresh execution: the 5xx released the key",
        r2.summary(),
    );
    rec.check_effects_as(
        clause!("idem.failure.5xx-not-stored"),
        Consequence::Behaviour,
        0,
        marker,
        &[r1, r2],
        1,
        "only the retry executed",
    )
    .await;
}

async fn by_body(rec: &mut Rec) {
    let Some(template) = rec.ctx.endpoint().server_error_body.clone() else {
        return;
    };
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let marker = rec.ctx.marker();
    let body =
        crate::server::manifest::expand(&template, rec.ctx.caller(0), &marker, rec.ctx.amount());
    let req = rec.ctx.op(0, Some(&key), &marker, &body);
    let Some(r1) = rec
        .send(
            &format!("{name} sends the declared server-error body with {a}"),
            &req,
        )
        .await
    else {
        return;
    };
    if !confirm_server_error(rec, &r1, &marker, "endpoints[0].server_error_body").await {
        return;
    }
    rec.check_effects(
        clause!("idem.claim.transactional"),
        0,
        &marker,
        &[&r1],
        0,
        "the failed attempt committed nothing",
    )
    .await;
    // R2: the same request again. Released, the key lets it run again (and
    // fail again); stored, the 5xx comes back from the store.
    let Some(r2) = rec.send(&format!("{name} retries it with {a}"), &req).await else {
        return;
    };
    if r2.status >= 500 {
        let marked = rec.ctx.manifest.marked(&r2) == Some(true) || r2.replayed();
        rec.check(
            clause!("idem.failure.5xx-not-stored"),
            !marked,
            "the retry's 5xx is its own, not the stored one marked as a replay",
            r2.summary(),
        );
        rec.headline(format!(
            "a {} was stored and replayed to the retry: R1 {}, R2 {} (marked as a replay)",
            r1.status,
            r1.summary(),
            r2.summary()
        ));
    }
    // Fewer runs than sends is the 5xx stored (or the key left taken): the
    // retry's caller is told the truth about effects either way (nothing
    // ran, or it failed again), so by the severity rule it is semantics.
    match rec
        .check_executions_as(
            clause!("idem.failure.5xx-not-stored"),
            Consequence::Behaviour,
            &marker,
            2,
            &format!(
                "a request that failed with a {}, retried with its key and answered {}",
                r1.status, r2.status
            ),
        )
        .await
    {
        Some(_) => {}
        None if rec.stopped.is_some() => return,
        None => rec.note(
            "no hooks.execution_probe: an unmarked 5xx replayed from the store cannot be told from a fresh one; R3 checks the key was released",
        ),
    }
    // R3: the key with the endpoint's own body, which succeeds when the
    // 5xx left nothing behind.
    let marker3 = rec.ctx.marker();
    let body3 = rec.ctx.body(0, &marker3);
    let req3 = rec.ctx.op(0, Some(&key), &marker3, &body3);
    let Some(r3) = rec
        .send(
            &format!("{name} sends the endpoint's own body with {a}"),
            &req3,
        )
        .await
    else {
        return;
    };
    retry_after_5xx(rec, &r1, &r3, &marker3).await;
}

/// How long R1 waits for the early refusal.
const EARLY_ANSWER: std::time::Duration = std::time::Duration::from_secs(2);

/// The `Content-Length` R1 declares: far over any reasonable body limit.
const DECLARED_LENGTH: usize = 64 << 20;

/// Sends `req` over a plain TCP connection with a `Content-Length` of
/// [`DECLARED_LENGTH`] but only the first bytes of its body, and returns
/// the status the target answers with. A server that refuses by declared
/// length answers at once; one that waits for the body does not, and the
/// read times out. Plain HTTP only: an `https` target makes the case
/// inconclusive. (An HTTP client library cannot be used here: when the
/// server answers before reading a large body and closes the connection,
/// the client loses the answer in a transport error.)
async fn send_declared_oversize(req: &crate::server::http::Request) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = reqwest::Url::parse(&req.url).map_err(|e| format!("bad URL: {e}"))?;
    if url.scheme() != "http" {
        return Err(format!(
            "needs a plain http:// target, not {}",
            url.scheme()
        ));
    }
    let host = url.host_str().ok_or("URL without a host")?.to_owned();
    let port = url.port_or_known_default().ok_or("URL without a port")?;
    let mut target = url.path().to_owned();
    if let Some(q) = url.query() {
        target.push('?');
        target.push_str(q);
    }
    let mut head = format!(
        "{} {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\nContent-Length: {DECLARED_LENGTH}\r\n",
        req.method
    )
    .into_bytes();
    for (name, value) in &req.headers {
        if name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("host") {
            continue;
        }
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    // A first slice of the body: whitespace, as a JSON body may start with.
    head.extend_from_slice(&[b' '; 1024]);
    // A target that refuses by declared length answers at once; one that
    // waits for the body never will, so a long wait only costs time.
    let bound = EARLY_ANSWER;
    let io = async {
        let mut sock = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        sock.write_all(&head)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::with_capacity(256);
        let mut chunk = [0u8; 256];
        // Bounded: at most 16 reads of the status line.
        for _ in 0..16 {
            if buf.windows(2).any(|w| w == b"\r\n") {
                break;
            }
            let n = sock
                .read(&mut chunk)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let line = String::from_utf8_lossy(&buf);
        line.split(' ')
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| format!("no status line in {:?}", line.lines().next().unwrap_or("")))
    };
    match tokio::time::timeout(bound, io).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no answer within {} ms: the target waits for the declared body (it does not refuse by declared length)",
            bound.as_millis()
        )),
    }
}

async fn before_claim(rec: &mut Rec) {
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&key), &marker, &body);
    let label = rec.next_label();
    // curl sends the declared length and the short body, then waits: the
    // same exchange the kit makes on its own socket.
    let oversized = req
        .clone()
        .without_header("Content-Length")
        .header("Content-Length", &DECLARED_LENGTH.to_string());
    rec.reproduction.push(format!(
        "# {label} (declares Content-Length: {DECLARED_LENGTH}, sends far less; expect an early 413)\n{}",
        rec.ctx.client.curl(&oversized)
    ));
    let status = match send_declared_oversize(&req).await {
        Ok(s) => s,
        Err(e) => {
            rec.note(format!(
                "{label}: {name} sends with {a} a request declaring Content-Length: {DECLARED_LENGTH} → {e}"
            ));
            rec.stop(
                Verdict::Inconclusive,
                format!("no early refusal to check: {e}"),
            );
            return;
        }
    };
    rec.note(format!(
        "{label}: {name} sends with {a} a request declaring Content-Length: {DECLARED_LENGTH} (only its first 1024 bytes sent) → {status}"
    ));
    if !matches!(status, 408 | 413 | 429) {
        rec.stop(
            Verdict::Inconclusive,
            format!(
                "the oversized request was not refused with 408, 413 or 429 (got {status}), so there is no early answer to check"
            ),
        );
        return;
    }
    let Some(r2) = rec
        .send(&format!("{name} sends the plain body with {a}"), &req)
        .await
    else {
        return;
    };
    rec.check(
        clause!("idem.failure.before-claim"),
        rec.ctx.dialect().executed(&r2, None),
        format!(
            "a fresh execution: the {status} was decided before the claim and the key stayed free"
        ),
        r2.summary(),
    );
    rec.check_effects(
        clause!("idem.failure.before-claim"),
        0,
        &marker,
        &[&r2],
        1,
        "only the plain attempt executed",
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rec() -> Rec {
        let m = crate::server::manifest::parse(crate::server::manifest::TEMPLATE, "t")
            .expect("template")
            .manifest;
        let client =
            crate::server::http::Client::new(std::time::Duration::from_secs(1), 10, 4, 10, [])
                .expect("client");
        Rec::new(Arc::new(crate::server::case::Ctx::new(
            m,
            client,
            "run".into(),
            1,
        )))
    }

    fn resp(status: u16, retry_after: bool) -> Response {
        Response {
            status,
            headers: if retry_after {
                vec![("retry-after".into(), "1".into())]
            } else {
                vec![]
            },
            body: b"{}".to_vec(),
        }
    }

    // The rule: the 5xx case judges only an answer it confirmed to be the
    // declared server error.
    #[tokio::test]
    async fn only_a_confirmed_server_error_is_judged() {
        for (status, retry_after, confirmed) in [
            (500, false, true),
            (502, false, true),
            (501, false, false), // listed in profile.unsupported_statuses
            (503, true, false),  // shed load
            (422, false, false),
        ] {
            let mut r = rec();
            let ok =
                confirm_server_error(&mut r, &resp(status, retry_after), "m", "the body").await;
            assert_eq!(ok, confirmed, "{status}");
            assert_eq!(
                r.stopped.as_ref().map(|(v, _)| *v),
                (!confirmed).then_some(Verdict::Inconclusive),
                "{status}"
            );
            assert!(r.checks.is_empty(), "no verdict from an unconfirmed answer");
        }
    }
}
