//! Waivers as reviewed data: matching a waiver's pattern to case IDs, and
//! reporting waivers that have gone stale.

use idem_spec::manifest::Waiver;
use idem_spec::report::{CaseReport, Verdict, WaiverReport};

/// `*` matches any run of characters; everything else matches itself.
pub fn matches(pattern: &str, id: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len()).any(|i| go(rest, &s[i..])),
            Some((c, rest)) => s.first() == Some(c) && go(rest, &s[1..]),
        }
    }
    go(pattern.as_bytes(), id.as_bytes())
}

/// Marks waived cases and reports every waiver, stale ones with a reason.
pub fn apply(waivers: &[Waiver], cases: &mut [CaseReport]) -> Vec<WaiverReport> {
    waivers
        .iter()
        .map(|w| {
            let mut matched = Vec::new();
            for c in cases.iter_mut().filter(|c| matches(&w.case, &c.id)) {
                if c.waived.is_none() {
                    c.waived = Some(w.reason.clone());
                }
                matched.push(c.id.clone());
            }
            let stale = if matched.is_empty() {
                Some("matches no case".to_owned())
            } else if cases
                .iter()
                .filter(|c| matched.contains(&c.id))
                .all(|c| c.verdict == Verdict::Pass)
            {
                Some("every case it matches now passes; remove it".to_owned())
            } else {
                None
            };
            WaiverReport {
                case: w.case.clone(),
                reason: w.reason.clone(),
                matched,
                stale,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_spec::clauses::Level;

    fn case(id: &str, verdict: Verdict) -> CaseReport {
        CaseReport {
            id: id.into(),
            family: id.split('.').next().unwrap_or(id).into(),
            title: String::new(),
            tier: Level::Must,
            clauses: vec![],
            verdict,
            reason: None,
            checks: vec![],
            narrative: vec![],
            reproduction: vec![],
            waived: None,
            duration_ms: 0,
            side_effect_requests: 0,
            rerun: None,
        }
    }

    #[test]
    fn globs_match_whole_ids() {
        assert!(matches("windows.*", "windows.expiry"));
        assert!(matches("*", "keys.invalid-rejected"));
        assert!(matches("keys.*-rejected", "keys.missing-rejected"));
        assert!(!matches("windows.*", "keys.windows.x"));
        assert!(!matches("keys.invalid", "keys.invalid-rejected"));
    }

    #[test]
    fn stale_waivers_are_reported_with_their_reason() {
        let mut cases = vec![
            case("windows.expiry", Verdict::Fail),
            case("keys.quoted-and-bare", Verdict::Pass),
        ];
        let w = |p: &str| Waiver {
            case: p.into(),
            reason: "r".into(),
            link: None,
        };
        let reports = apply(
            &[w("windows.*"), w("keys.quoted-*"), w("nothing.*")],
            &mut cases,
        );
        assert_eq!(reports[0].stale, None);
        assert_eq!(reports[0].matched, vec!["windows.expiry"]);
        assert!(
            reports[1]
                .stale
                .as_deref()
                .is_some_and(|s| s.contains("now passes"))
        );
        assert_eq!(reports[2].stale.as_deref(), Some("matches no case"));
        assert_eq!(cases[0].waived.as_deref(), Some("r"));
    }
}
