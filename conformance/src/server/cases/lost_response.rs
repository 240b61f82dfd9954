//! The lost-response case: the target commits, the response is lost on the
//! way back, the client retries with the same key.

use idem_conformance_core::clause;
use std::time::Duration;

use super::check_marked;
use crate::server::case::{Aim, Case, HOLD, Rec, shared};
use crate::server::manifest::ManifestExt;
use crate::server::proxy::DropProxy;
use idem_spec::report::Verdict;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![Case {
        id: "lost.response-dropped",
        title: "a retry after a lost response gets the committed outcome, not a second execution",
        clauses: &[
            clause!("idem.replay.no-reexecution"),
            clause!("idem.replay.marker"),
            clause!("idem.state.three-states"),
        ],
        needs: &[],
        aim: Aim::Main,
        alone: shared,
        permitted: |m| {
            vec![format!(
                "R1 through the dropping proxy: no answer (the target answered 2xx); R2 directly, same key: a replay with {}; one effect",
                m.marker_spelled()
            )]
        },
        run: |r| Box::pin(dropped(r)),
    }]
}

async fn dropped(rec: &mut Rec) {
    let timeout = Duration::from_millis(rec.ctx.manifest.limits.request_timeout_ms);
    let mut proxy = match DropProxy::start(&rec.ctx.manifest.target.base_url, timeout).await {
        Ok(p) => p,
        Err(e) => {
            rec.stop(Verdict::Error, e.to_string());
            return;
        }
    };
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&key), &marker, &body);
    let name = rec.ctx.name(0).to_owned();
    let mut via = req.clone();
    via.url = via.url.replacen(
        rec.ctx.manifest.target.base_url.trim_end_matches('/'),
        &proxy.base_url,
        1,
    );
    let label = rec.next_label();
    rec.reproduction.push(format!(
        "# {label} (through a proxy that drops the response)\n{}",
        rec.ctx.client.curl(&req)
    ));
    let lost = rec.ctx.client.send(&via).await;
    let dropped = proxy.next_dropped(timeout + HOLD).await;
    match (&lost, &dropped) {
        (Err(_), Some(d)) => rec.note(format!(
            "{label}: {name} sends with {a} through the proxy; the target answered {}, the proxy dropped it, {name} saw no response",
            d.status.map_or("nothing".to_owned(), |s| s.to_string())
        )),
        _ => {
            rec.stop(Verdict::Error, format!("the proxy did not drop the response as designed: {lost:?} / {dropped:?}"));
            return;
        }
    }
    if !dropped
        .as_ref()
        .and_then(|d| d.status)
        .is_some_and(|s| (200..300).contains(&s))
    {
        rec.stop(
            Verdict::Inconclusive,
            "the target did not execute the forwarded request (no 2xx behind the proxy)",
        );
        return;
    }
    let Some(r2) = rec
        .send(&format!("{name} retries directly with {a}"), &req)
        .await
    else {
        return;
    };
    rec.check(
        clause!("idem.state.three-states"),
        (200..300).contains(&r2.status),
        "the committed outcome (2xx)",
        r2.summary(),
    );
    if (200..300).contains(&r2.status) {
        check_marked(rec, &r2, "the retry's replay");
    }
    rec.check_effects(
        clause!("idem.replay.no-reexecution"),
        0,
        &marker,
        &[&r2],
        1,
        "a retry after a lost response",
    )
    .await;
    rec.check_executions(
        clause!("idem.replay.no-reexecution"),
        &marker,
        1,
        "a retry after a lost response",
    )
    .await;
}
