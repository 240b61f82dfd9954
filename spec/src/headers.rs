//! Header names of the idempotency surface and the `Prefer: wait` parser.

/// Request header carrying the key.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Response header marking a replayed response (clause `idem.replay.marker`).
pub const IDEMPOTENT_REPLAYED: &str = "Idempotent-Replayed";
/// Response header on 409 in-use (and 429/503) answers.
pub const RETRY_AFTER: &str = "Retry-After";
/// Request header for RFC 7240 preferences (`wait=N`).
pub const PREFER: &str = "Prefer";
/// Response header confirming an honoured preference.
pub const PREFERENCE_APPLIED: &str = "Preference-Applied";

/// Response header with the end of the key's replay window, an HTTP-date
/// (RFC 9110 `IMF-fixdate`), on every answer the key governs: first
/// execution, replay, in-flight refusal and mismatch (clause
/// `idem.window.expiry-header`). An extension of this contract; no draft
/// defines one.
pub const IDEMPOTENCY_KEY_EXPIRES: &str = "Idempotency-Key-Expires";

/// Request header carrying what is left of the caller's overall deadline, in
/// whole milliseconds, relative to when the attempt is sent (clauses
/// `idem.client.deadline-header`, `idem.client.deadline-header-truthful`;
/// on the server, `idem.deadline.spent` and `idem.deadline.bound`).
pub const REQUEST_DEADLINE_MS: &str = "Request-Deadline-Ms";

/// The most digits a [`REQUEST_DEADLINE_MS`] value may have (about 11 days).
pub const REQUEST_DEADLINE_MAX_DIGITS: usize = 9;

/// The largest [`REQUEST_DEADLINE_MS`] value: [`REQUEST_DEADLINE_MAX_DIGITS`]
/// nines. A sender with more time left sends this.
pub const REQUEST_DEADLINE_MAX_MS: u64 = 999_999_999;

/// Parses a [`REQUEST_DEADLINE_MS`] value: 1 to 9 ASCII digits, nothing
/// else (no sign, unit, fraction or surrounding space beyond what HTTP
/// trims). `None` for anything else, which a receiver ignores.
pub fn parse_request_deadline_ms(value: &str) -> Option<std::time::Duration> {
    let v = value.trim_matches(|c| c == ' ' || c == '\t');
    if v.is_empty()
        || v.len() > REQUEST_DEADLINE_MAX_DIGITS
        || !v.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    v.parse().ok().map(std::time::Duration::from_millis)
}

/// Headers every replay reproduces when the original response had them
/// (clause `idem.replay.verbatim`); endpoints may declare more.
pub const REPLAYED_HEADERS: [&str; 3] = ["Content-Type", "Location", "ETag"];

/// Extracts `wait=N` (seconds) from the values of `Prefer` headers.
///
/// RFC 7240 allows several preferences per header and several headers; the
/// first well-formed `wait` wins and malformed ones are ignored, as the RFC
/// asks servers to ignore preferences they do not understand.
pub fn prefer_wait_secs<'a, I>(values: I) -> Option<u64>
where
    I: IntoIterator<Item = &'a str>,
{
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter_map(|pref| {
            let pref = pref.split(';').next()?.trim();
            let (name, value) = pref.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            value.trim().trim_matches('"').parse::<u64>().ok()
        })
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    // clause: idem.inflight.prefer-wait
    #[test]
    fn prefer_wait_is_parsed_leniently() {
        assert_eq!(prefer_wait_secs(["wait=5"]), Some(5));
        assert_eq!(prefer_wait_secs(["respond-async, Wait = 7"]), Some(7));
        assert_eq!(prefer_wait_secs(["return=minimal", "wait=\"3\""]), Some(3));
        assert_eq!(prefer_wait_secs(["wait=soon", "wait=2"]), Some(2));
        assert_eq!(prefer_wait_secs(["return=minimal"]), None);
        assert_eq!(prefer_wait_secs([]), None);
    }

    #[test]
    fn request_deadline_values_follow_the_grammar() {
        use std::time::Duration;
        assert_eq!(
            parse_request_deadline_ms("19473"),
            Some(Duration::from_millis(19_473))
        );
        assert_eq!(parse_request_deadline_ms(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            parse_request_deadline_ms("999999999"),
            Some(Duration::from_millis(999_999_999))
        );
        for bad in [
            "",
            "1000000000",
            "-5",
            "+5",
            "1.5",
            "10ms",
            "1e3",
            "\u{661}",
        ] {
            assert_eq!(parse_request_deadline_ms(bad), None, "{bad:?}");
        }
    }
}
