//! [`sql`]: one SQL text for every store's placeholders.
//!
//! SQLite and PostgreSQL accept `$1, $2, ...`; MySQL accepts only `?`. An
//! application that runs the same statement on whichever store
//! [`with_conn!`](crate::with_conn) hands it writes `$N` placeholders, each
//! once and in order, and passes the text through [`sql`] with the
//! connection: unchanged on SQLite and PostgreSQL, `?` on MySQL.

use std::borrow::Cow;

/// The placeholder style of a connection type (see [`sql`]).
pub trait Dialect {
    /// Whether placeholders are `?` (MySQL) rather than `$N`.
    const QUESTION_MARKS: bool;
}

#[cfg(feature = "sqlite")]
impl Dialect for sqlx::SqliteConnection {
    const QUESTION_MARKS: bool = false;
}

#[cfg(feature = "postgres")]
impl Dialect for sqlx::PgConnection {
    const QUESTION_MARKS: bool = false;
}

#[cfg(feature = "mysql")]
impl Dialect for sqlx::MySqlConnection {
    const QUESTION_MARKS: bool = true;
}

#[cfg(feature = "sqlite")]
impl Dialect for sqlx::SqlitePool {
    const QUESTION_MARKS: bool = false;
}

#[cfg(feature = "postgres")]
impl Dialect for sqlx::PgPool {
    const QUESTION_MARKS: bool = false;
}

#[cfg(feature = "mysql")]
impl Dialect for sqlx::MySqlPool {
    const QUESTION_MARKS: bool = true;
}

/// `portable` with its `$N` placeholders in the style of `conn` (a
/// connection or a pool): unchanged for SQLite and PostgreSQL, `?` for
/// MySQL. Text inside single quotes is left alone.
///
/// MySQL binds `?` by position, so `$N` must appear in order, each once
/// (`$1 ... $2 ... $3`); a text that does not is returned unchanged, and
/// MySQL then refuses it as a syntax error rather than bind a value to the
/// wrong placeholder.
pub fn sql<'a, C: Dialect + ?Sized>(_conn: &C, portable: &'a str) -> Cow<'a, str> {
    if !C::QUESTION_MARKS {
        return Cow::Borrowed(portable);
    }
    question_marks(portable).map_or(Cow::Borrowed(portable), Cow::Owned)
}

/// Whether `conn` (a connection or a pool) is MySQL, for the few
/// statements that differ beyond placeholders (an upsert is `ON CONFLICT`
/// elsewhere and `ON DUPLICATE KEY UPDATE` there).
pub fn is_mysql<C: Dialect + ?Sized>(_conn: &C) -> bool {
    C::QUESTION_MARKS
}

/// `$1 ... $N` in order become `?`; `None` if they are not in order.
fn question_marks(portable: &str) -> Option<String> {
    let mut out = String::with_capacity(portable.len());
    let mut chars = portable.chars().peekable();
    let (mut quoted, mut next) = (false, 1_u32);
    while let Some(ch) = chars.next() {
        if ch == '\'' {
            quoted = !quoted;
        }
        if ch == '$' && !quoted && chars.peek().is_some_and(char::is_ascii_digit) {
            let mut n = 0_u32;
            while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                n = n.checked_mul(10)?.checked_add(d)?;
                chars.next();
            }
            if n != next {
                return None;
            }
            next += 1;
            out.push('?');
        } else {
            out.push(ch);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::question_marks;

    #[test]
    fn placeholders_in_order_become_question_marks_and_quoted_text_is_kept() {
        assert_eq!(
            question_marks("UPDATE a SET b = $1, c = '$2' WHERE id = $2 AND n = $3").as_deref(),
            Some("UPDATE a SET b = ?, c = '$2' WHERE id = ? AND n = ?")
        );
        assert_eq!(
            question_marks("SELECT $10").as_deref(),
            None,
            "starts at $1"
        );
        assert_eq!(question_marks("x = $2 AND y = $1"), None, "out of order");
        assert_eq!(question_marks("x = $1 OR y = $1"), None, "used twice");
        assert_eq!(question_marks("no params").as_deref(), Some("no params"));
    }
}
