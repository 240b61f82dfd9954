//! Cursor pagination for the list endpoints (`GET /v1/transfers`,
//! `GET /v1/payments`, `GET /v1/receipts`).
//!
//! A list answers at most `limit` items (default [`DEFAULT_LIMIT`], at most
//! [`MAX_LIMIT`]) in a stable order, and a `next_cursor` to pass back as
//! `?cursor=` for the items after them (`null` on the last page). The
//! cursor is a position (the sort key of the last item sent), not an
//! offset: a page costs one index range scan however deep it is, and items
//! inserted meanwhile neither repeat nor shift the pages. It is opaque to
//! clients (hex, tagged with the list it came from) and needs no secret:
//! every query stays bound to the caller, so a forged cursor can only skip
//! within the caller's own items.
//!
//! Why this matters in a template: a list without a limit answers a
//! caller's whole history (8.1 MB after ten minutes of traffic on this
//! server, before pagination), and grows with every request.

use crate::error::{Error, Result};

/// The two statements of a list ordered by `(created_at, id)`: the count
/// of every row of the caller's that matches, and one page after the
/// cursor. `select` is `SELECT … FROM table WHERE owner = $1`; `filters`
/// are column names fixed by the endpoint (never taken from the query
/// string), each `= $n`. Binds, in order: the owner, each filter's value,
/// then (when `after`) the cursor's `created_at` twice and its `id`, then
/// the limit. Each placeholder appears once and in order, so the text also
/// runs on MySQL's `?` (`axum_idempotency::store::sql`).
pub fn statements(table: &str, select: &str, filters: &[&str], after: bool) -> (String, String) {
    let mut filter = String::new();
    let mut n = 1;
    for column in filters {
        n += 1;
        filter.push_str(&format!(" AND {column} = ${n}"));
    }
    let count = format!("SELECT COUNT(*) FROM {table} WHERE owner = $1{filter}");
    let mut page = format!("{select}{filter}");
    if after {
        // The >= lets the index range start at the cursor; the OR breaks
        // ties on created_at by id.
        page.push_str(&format!(
            " AND created_at >= ${a} AND (created_at > ${b} OR id > ${c})",
            a = n + 1,
            b = n + 2,
            c = n + 3
        ));
        n += 3;
    }
    page.push_str(&format!(" ORDER BY created_at, id LIMIT ${}", n + 1));
    (count, page)
}

/// Items per page when the request names no `limit`.
pub const DEFAULT_LIMIT: u32 = 50;

/// The largest `limit` a request may ask for.
pub const MAX_LIMIT: u32 = 200;

/// The page size a request asks for with `?limit=`: [`DEFAULT_LIMIT`]
/// without one, 422 outside 1..=[`MAX_LIMIT`].
///
/// Each list declares `limit` and `cursor` in its own query type (serde's
/// `flatten` would lose both `deny_unknown_fields` and numeric parsing of
/// query strings).
pub fn limit(requested: Option<u32>) -> Result<u32> {
    match requested {
        None => Ok(DEFAULT_LIMIT),
        Some(n @ 1..=MAX_LIMIT) => Ok(n),
        Some(n) => Err(Error::Validation(format!(
            "limit must be between 1 and {MAX_LIMIT} (got {n})"
        ))),
    }
}

/// Where a page of a list ordered by `(created_at, id)` starts after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The last item's creation time, milliseconds.
    pub created_at: i64,
    /// The last item's id (ties on `created_at` are ordered by id).
    pub id: String,
}

/// Encodes `position` as an opaque cursor of the list `tag`.
pub fn cursor(tag: &str, position: &Position) -> String {
    hex::encode(format!("{tag}:{}:{}", position.created_at, position.id))
}

/// Decodes a cursor of the list `tag`: 422 when it is not one.
pub fn position(tag: &str, cursor: &str) -> Result<Position> {
    let bad = || Error::Validation(format!("cursor {cursor:?} is not a cursor of this list"));
    let bytes = hex::decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let rest = text
        .strip_prefix(tag)
        .and_then(|r| r.strip_prefix(':'))
        .ok_or_else(bad)?;
    let (at, id) = rest.split_once(':').ok_or_else(bad)?;
    let created_at = at.parse().map_err(|_| bad())?;
    if id.is_empty() || id.len() > 64 {
        return Err(bad());
    }
    Ok(Position {
        created_at,
        id: id.to_owned(),
    })
}

/// Encodes a numeric position (the receipts' job id) as a cursor of `tag`.
pub fn number_cursor(tag: &str, n: i64) -> String {
    hex::encode(format!("{tag}:{n}"))
}

/// Decodes a [`number_cursor`] of the list `tag`.
pub fn number_position(tag: &str, cursor: &str) -> Result<i64> {
    let bad = || Error::Validation(format!("cursor {cursor:?} is not a cursor of this list"));
    let bytes = hex::decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    text.strip_prefix(tag)
        .and_then(|r| r.strip_prefix(':'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(bad)
}

/// Splits `rows` (fetched with `limit + 1`) into the page and whether more
/// follow.
pub fn split<T>(mut rows: Vec<T>, limit: u32) -> (Vec<T>, bool) {
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    (rows, more)
}

/// The page of a list ordered by `(created_at, id)`, from the `limit + 1`
/// rows its [`statements`] fetched (each item with its `created_at`), and
/// the cursor of the next page (`None` on the last one).
pub fn finish<T>(
    tag: &str,
    rows: Vec<(T, i64)>,
    limit: u32,
    id: impl Fn(&T) -> &str,
) -> (Vec<T>, Option<String>) {
    let (rows, more) = split(rows, limit);
    let next = more
        .then(|| rows.last())
        .flatten()
        .map(|(item, created_at)| {
            cursor(
                tag,
                &Position {
                    created_at: *created_at,
                    id: id(item).to_owned(),
                },
            )
        });
    (rows.into_iter().map(|(item, _)| item).collect(), next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_other_lists_and_garbage() {
        let p = Position {
            created_at: 1_764_584_102_417,
            id: "tr_7a4c".into(),
        };
        let c = cursor("transfers", &p);
        assert!(c.bytes().all(|b| b.is_ascii_hexdigit()), "URL-safe: {c}");
        assert_eq!(position("transfers", &c).expect("decode"), p);
        assert!(position("payments", &c).is_err(), "another list's cursor");
        for junk in [
            "",
            "zz",
            "00",
            &hex::encode("transfers:x:tr_1"),
            &hex::encode("transfers:1:"),
        ] {
            assert!(position("transfers", junk).is_err(), "{junk:?}");
        }
        let n = number_cursor("receipts", 42);
        assert_eq!(number_position("receipts", &n).expect("decode"), 42);
        assert!(number_position("transfers", &n).is_err());
    }

    #[test]
    fn limits_default_and_are_bounded() {
        assert_eq!(limit(None).expect("default"), DEFAULT_LIMIT);
        assert_eq!(limit(Some(1)).expect("one"), 1);
        assert_eq!(limit(Some(MAX_LIMIT)).expect("max"), MAX_LIMIT);
        assert!(limit(Some(0)).is_err());
        assert!(limit(Some(MAX_LIMIT + 1)).is_err());
        let (page, more) = split(vec![1, 2, 3], 2);
        assert_eq!((page, more), (vec![1, 2], true));
        let (page, more) = split(vec![1, 2], 2);
        assert_eq!((page, more), (vec![1, 2], false));
    }
}
