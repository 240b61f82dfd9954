//! A passive reader of HTTP/1.1 request framing: it watches the bytes hyper
//! reads from a connection and tells the connection's watchdog where each
//! request head starts and ends, and whether a head carried both
//! `Content-Length` and `Transfer-Encoding`.
//!
//! Why not ask hyper: hyper knows these things but does not say them. It
//! starts its header-read timer when it *begins* waiting for a head, so on
//! a keep-alive connection that timer is also an idle timer, and it
//! silently drops `Content-Length` when `Transfer-Encoding` is present (it
//! frames by `Transfer-Encoding` and closes the connection afterwards, as
//! RFC 9112 §6.1 allows), so the service cannot see that the request was
//! ambiguous. This reader follows the same framing rules (a head ends at
//! an empty line; then a chunked body, a `Content-Length` body, or none)
//! and never changes a byte.
//!
//! It gives up (and reports nothing more) where hyper would close the
//! connection anyway or where framing stops being HTTP/1: a head over
//! [`MAX_HEAD_BYTES`], a `Transfer-Encoding` whose last coding is not
//! `chunked`, conflicting `Content-Length`s, a chunk size it cannot read,
//! and after the first head with both framing headers. This server has no
//! upgrade or CONNECT routes, so a connection stays HTTP/1 throughout.

/// Longest head followed: well past hyper's limit (64 KiB, checked
/// between reads, so a head that arrives in one read can be longer).
pub(crate) const MAX_HEAD_BYTES: usize = 256 * 1024;

/// Bytes of each line kept for inspection: enough for a header name and a
/// framing value; the rest of a long line is counted, not stored.
const LINE_KEEP: usize = 256;

/// What [`Framing::feed`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// The first byte of a request head.
    HeadStarted,
    /// A head is complete; `conflicting` when it carried both
    /// `Content-Length` and `Transfer-Encoding`.
    HeadComplete {
        /// Both framing headers were present.
        conflicting: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Fixed(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkDataEnd,
    Trailers,
    Stopped,
}

/// The framing state of one connection's request stream.
#[derive(Debug)]
pub(crate) struct Framing {
    state: State,
    line: Vec<u8>,
    head_len: usize,
    request_line_seen: bool,
    content_length: Option<u64>,
    content_length_seen: bool,
    content_lengths_differ: bool,
    transfer_encoding_seen: bool,
    chunked_last: bool,
}

impl Default for Framing {
    fn default() -> Self {
        Self {
            state: State::Head,
            line: Vec::with_capacity(LINE_KEEP),
            head_len: 0,
            request_line_seen: false,
            content_length: None,
            content_length_seen: false,
            content_lengths_differ: false,
            transfer_encoding_seen: false,
            chunked_last: false,
        }
    }
}

impl Framing {
    /// Bytes of the current head seen so far (0 between requests, and
    /// while a body is being read).
    pub(crate) fn head_bytes(&self) -> usize {
        if self.state == State::Head {
            self.head_len
        } else {
            0
        }
    }

    /// Follows `bytes`, the next bytes read from the connection, calling
    /// `on` for each event in order.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], mut on: impl FnMut(Event)) {
        while !bytes.is_empty() {
            match self.state {
                State::Stopped => return,
                State::Head => {
                    if self.head_len == 0 {
                        on(Event::HeadStarted);
                    }
                    let (line_done, used) = self.take_line(bytes);
                    bytes = &bytes[used..];
                    self.head_len += used;
                    if self.head_len > MAX_HEAD_BYTES {
                        self.state = State::Stopped;
                        return;
                    }
                    if line_done {
                        self.head_line(&mut on);
                    }
                }
                State::Fixed(n) => {
                    let used = bytes.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                    bytes = &bytes[used..];
                    let left = n - used as u64;
                    self.state = if left == 0 {
                        self.next_head()
                    } else {
                        State::Fixed(left)
                    };
                }
                State::ChunkSize => {
                    let (line_done, used) = self.take_line(bytes);
                    bytes = &bytes[used..];
                    if line_done {
                        self.state = match chunk_size(&self.line) {
                            Some(0) => State::Trailers,
                            Some(n) => State::ChunkData(n),
                            None => State::Stopped,
                        };
                        self.line.clear();
                    }
                }
                State::ChunkData(n) => {
                    let used = bytes.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                    bytes = &bytes[used..];
                    let left = n - used as u64;
                    self.state = if left == 0 {
                        State::ChunkDataEnd
                    } else {
                        State::ChunkData(left)
                    };
                }
                State::ChunkDataEnd => {
                    let (line_done, used) = self.take_line(bytes);
                    bytes = &bytes[used..];
                    if line_done {
                        self.line.clear();
                        self.state = State::ChunkSize;
                    }
                }
                State::Trailers => {
                    let (line_done, used) = self.take_line(bytes);
                    bytes = &bytes[used..];
                    if line_done {
                        let empty = self.line.is_empty();
                        self.line.clear();
                        if empty {
                            self.state = self.next_head();
                        }
                    }
                }
            }
        }
    }

    /// Appends bytes of the current line (up to and including `\n`) to the
    /// kept line, without the line ending: (line complete, bytes used).
    fn take_line(&mut self, bytes: &[u8]) -> (bool, usize) {
        let (chunk, done) = match bytes.iter().position(|&b| b == b'\n') {
            Some(i) => (&bytes[..i], true),
            None => (bytes, false),
        };
        let room = LINE_KEEP.saturating_sub(self.line.len());
        self.line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if done && self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        (done, chunk.len() + usize::from(done))
    }

    fn head_line(&mut self, on: &mut impl FnMut(Event)) {
        let line = std::mem::take(&mut self.line);
        if !self.request_line_seen {
            // An empty line before the request line is ignored (RFC 9112 §2.2).
            self.request_line_seen = !line.is_empty();
        } else if line.is_empty() {
            let conflicting = self.content_length_seen && self.transfer_encoding_seen;
            on(Event::HeadComplete { conflicting });
            self.state = if conflicting || self.content_lengths_differ {
                State::Stopped
            } else if self.transfer_encoding_seen {
                if self.chunked_last {
                    State::ChunkSize
                } else {
                    State::Stopped
                }
            } else {
                match self.content_length {
                    Some(n) if n > 0 => State::Fixed(n),
                    _ => self.next_head(),
                }
            };
        } else if let Some(colon) = line.iter().position(|&b| b == b':') {
            let name = &line[..colon];
            let value = trim(&line[colon + 1..]);
            if name.eq_ignore_ascii_case(b"content-length") {
                self.content_length_seen = true;
                let n = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                match (self.content_length, n) {
                    (_, None) => self.content_lengths_differ = true,
                    (Some(prev), Some(n)) if prev != n => self.content_lengths_differ = true,
                    (_, Some(n)) => self.content_length = Some(n),
                }
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                self.transfer_encoding_seen = true;
                let last = value.rsplit(|&b| b == b',').next().map(trim);
                self.chunked_last = last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
            }
        }
        let mut line = line;
        line.clear();
        self.line = line;
    }

    /// Resets the head state for the next request.
    fn next_head(&mut self) -> State {
        self.line.clear();
        self.head_len = 0;
        self.request_line_seen = false;
        self.content_length = None;
        self.content_length_seen = false;
        self.content_lengths_differ = false;
        self.transfer_encoding_seen = false;
        self.chunked_last = false;
        State::Head
    }
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &v[start..end]
}

/// The hex size at the start of a chunk-size line (extensions ignored).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events for `stream` fed whole, and fed one byte at a time: the two
    /// must agree (reads split anywhere).
    fn events(stream: &[u8]) -> Vec<Event> {
        let mut whole = Vec::new();
        let mut f = Framing::default();
        f.feed(stream, |e| whole.push(e));
        let mut bytewise = Vec::new();
        let mut f = Framing::default();
        for b in stream {
            f.feed(std::slice::from_ref(b), |e| bytewise.push(e));
        }
        assert_eq!(whole, bytewise, "split reads change nothing");
        whole
    }

    const START: Event = Event::HeadStarted;
    const OK: Event = Event::HeadComplete { conflicting: false };
    const BOTH: Event = Event::HeadComplete { conflicting: true };

    #[test]
    fn follows_pipelined_requests_with_every_kind_of_body() {
        let stream = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n\
            POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
            POST /y HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
            5;ext=1\r\nhello\r\n0\r\nTrailer: v\r\n\r\n\
            GET /z HTTP/1.1\n\n";
        assert_eq!(events(stream), [START, OK, START, OK, START, OK, START, OK]);
    }

    #[test]
    fn both_framing_headers_are_flagged_in_either_order_and_stop_the_reader() {
        for head in [
            &b"POST / HTTP/1.1\r\ncontent-length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\nContent-Length:3\r\n\r\n",
        ] {
            let mut stream = head.to_vec();
            // A request smuggled behind it is not followed.
            stream.extend_from_slice(b"0\r\n\r\nGET /admin HTTP/1.1\r\n\r\n");
            assert_eq!(events(&stream), [START, BOTH]);
        }
    }

    #[test]
    fn a_head_in_progress_is_counted_and_ends_the_count_when_complete() {
        let mut f = Framing::default();
        f.feed(b"GET / HTTP/1.1\r\nHost", |_| {});
        assert_eq!(f.head_bytes(), 20);
        f.feed(b": a\r\n\r\n", |_| {});
        assert_eq!(f.head_bytes(), 0);
        f.feed(b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nab", |_| {});
        assert_eq!(f.head_bytes(), 0, "a body is not a head");
        f.feed(b"cdG", |_| {});
        assert_eq!(f.head_bytes(), 1, "the next head started");
    }

    #[test]
    fn gives_up_where_hyper_refuses() {
        let mut f = Framing::default();
        f.feed(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            |_| {},
        );
        assert_eq!(f.state, State::Stopped);
        let mut f = Framing::default();
        f.feed(
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            |_| {},
        );
        assert_eq!(f.state, State::Stopped);
        let mut f = Framing::default();
        f.feed(&vec![b'a'; MAX_HEAD_BYTES + 1], |_| {});
        assert_eq!(f.state, State::Stopped);
        let mut f = Framing::default();
        f.feed(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            |_| {},
        );
        assert_eq!(f.state, State::Stopped);
    }
}
