//! The one error type of `idem-spec`.
//!
//! Key parsing errors are the hot path (every request header goes through
//! them), so each variant carries exactly what a client needs to fix its
//! request: the rule broken and where.

use thiserror::Error;

/// Everything that can go wrong in the spec crate: parsing an
/// `Idempotency-Key` header, naming a recovery point, or deriving the clause
/// list from the book.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The request carried no `Idempotency-Key` header at all.
    #[error("no Idempotency-Key header was sent")]
    KeyMissing,
    /// The request carried the header more than once (or a list of values).
    #[error("Idempotency-Key was sent {count} times; send it exactly once")]
    KeySeveralValues {
        /// How many header fields were seen.
        count: usize,
    },
    /// The header was present but empty (or only whitespace, or `""`).
    #[error("Idempotency-Key is empty; a key has 1 to 255 characters")]
    KeyEmpty,
    /// The unquoted key is longer than 255 characters.
    #[error("Idempotency-Key is {len} characters long; the maximum is {max}")]
    KeyTooLong {
        /// Length of the unquoted key, in characters (bytes: keys are ASCII).
        len: usize,
        /// The limit, [`crate::key::MAX_KEY_LEN`].
        max: usize,
    },
    /// A byte outside visible ASCII (0x21-0x7E) in the header value.
    #[error(
        "Idempotency-Key has a bad character 0x{byte:02X} at byte offset {position}; only visible ASCII (0x21-0x7E) is allowed"
    )]
    KeyBadCharacter {
        /// Zero-based byte offset in the header value as sent.
        position: usize,
        /// The offending byte.
        byte: u8,
    },
    /// A quoted key (`"..."`) that never closes.
    #[error("Idempotency-Key opens a quoted string but never closes it")]
    KeyUnterminatedQuote,
    /// A backslash in a quoted key followed by something other than `"` or `\`.
    #[error(
        "Idempotency-Key has an invalid escape at byte offset {position}; only \\\" and \\\\ are allowed"
    )]
    KeyBadEscape {
        /// Zero-based byte offset of the backslash.
        position: usize,
    },
    /// Characters after the closing quote of a quoted key.
    #[error("Idempotency-Key has characters after its closing quote, at byte offset {position}")]
    KeyTrailingCharacters {
        /// Zero-based byte offset of the first trailing byte.
        position: usize,
    },
    /// A recovery point name that is not lower-case snake case.
    #[error("recovery point {name:?} is not a lower-case snake_case name of 1 to 64 characters")]
    RecoveryPointInvalid {
        /// The rejected name.
        name: String,
    },
    /// A `r[...]` label in the book that does not follow the naming rules.
    #[error(
        "{file}:{line}: malformed clause label {label:?} (expected r[idem.area.rule], lower-case, dot-separated)"
    )]
    ClauseMalformed {
        /// Book file, relative to the book's `src/`.
        file: String,
        /// One-based line number.
        line: usize,
        /// The label as written.
        label: String,
    },
    /// The same clause ID labelled twice.
    #[error("clause {id} is labelled twice: {first} and {second}")]
    ClauseDuplicate {
        /// The duplicated ID.
        id: String,
        /// `file:line` of the first label.
        first: String,
        /// `file:line` of the second label.
        second: String,
    },
    /// A clause whose paragraph says neither MUST, SHOULD nor MAY.
    #[error("{file}:{line}: clause {id} states no level (MUST, SHOULD or MAY) in its paragraph")]
    ClauseNoLevel {
        /// The clause ID.
        id: String,
        /// Book file.
        file: String,
        /// One-based line number of the label.
        line: usize,
    },
    /// A clause label with no paragraph after it.
    #[error("{file}:{line}: clause {id} has no paragraph after its label")]
    ClauseNoText {
        /// The clause ID.
        id: String,
        /// Book file.
        file: String,
        /// One-based line number of the label.
        line: usize,
    },
    /// A clause the class table does not classify.
    #[error(
        "{file}:{line}: clause {id} has no class: add it to CLASSES in spec/src/clauses.rs (safety, semantics or interop)"
    )]
    ClauseNoClass {
        /// The clause ID.
        id: String,
        /// Book file.
        file: String,
        /// One-based line number of the label.
        line: usize,
    },
    /// A class-table entry that names no clause of the book, or a clause twice.
    #[error(
        "CLASSES in spec/src/clauses.rs lists {id}, which the book does not label (or lists it twice): remove the entry"
    )]
    ClassStale {
        /// The entry's clause ID.
        id: String,
    },
    /// A generated artifact could not be serialised.
    #[error("could not serialise generated artifact {what}: {message}")]
    Generate {
        /// Which artifact.
        what: String,
        /// The serialiser's message.
        message: String,
    },
}
