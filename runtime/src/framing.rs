//! Request framing followed beside hyper, byte for byte, so that the server can refuse what hyper
//! tolerates and measure what hyper does not report.
//!
//! hyper serves a request carrying both `Content-Length` and `Transfer-Encoding` (it frames by
//! the chunks, drops `Content-Length` from the headers and closes afterwards), so its handler
//! cannot tell that request from a plain chunked one; it also accepts transfer codings before
//! `chunked` (`gzip, chunked`). Both are shapes of request smuggling, refused here with 400. And
//! hyper's own answer to a head over its limits is a bare 431 with no body; following the bytes
//! gives each head's exact size and header count, so the server answers a problem body below a
//! hard ceiling and leaves only heads beyond it to hyper.
//!
//! [`Tracker`] parses each head with the same parser and configuration as hyper (`httparse`,
//! defaults) and skips each body by the same rules as hyper's decoder (exact `Content-Length`, or
//! chunks with CRLF line ends). Where it cannot follow (a head hyper refuses too, an upgrade) it
//! stops: later requests of the connection are then served without these checks, never with the
//! verdict of another request.

use std::collections::VecDeque;

/// What the tracker saw of one request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// The method, as sent.
    pub method: String,
    /// The request target, as sent.
    pub target: String,
    /// Bytes of the head: request line, header lines and the empty line (and any empty lines
    /// before the request line, as hyper counts them).
    pub bytes: usize,
    /// Header lines.
    pub headers: usize,
    /// Why the request's framing is refused, if it is.
    pub ambiguous: Option<&'static str>,
}

/// Follows the request bytes of one connection; see the module documentation.
#[derive(Debug)]
pub struct Tracker {
    state: State,
    /// Bytes of the head being read.
    head: Vec<u8>,
    /// hyper's limits: past them hyper answers 431 itself and this tracker stops.
    ceiling_bytes: usize,
    ceiling_headers: usize,
    /// Heads parsed and not yet taken by the handler, in order.
    heads: VecDeque<Head>,
    /// Chunk-extension bytes of the current body (hyper bounds them).
    extensions: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Head,
    /// Body bytes left of a `Content-Length` body.
    Length(u64),
    Chunked(Chunk),
    /// Not following any more.
    Lost,
}

/// The states of hyper's chunked decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    Start,
    Size(u64),
    SizeLws(u64),
    Extension(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
}

/// Chunk-extension bytes hyper accepts in one body.
const EXTENSION_LIMIT: u64 = 16 * 1024;

impl Tracker {
    /// A tracker for a connection whose hyper refuses heads over `ceiling_bytes` or with more
    /// than `ceiling_headers` header lines.
    pub fn new(ceiling_bytes: usize, ceiling_headers: usize) -> Tracker {
        Tracker {
            state: State::Head,
            head: Vec::new(),
            ceiling_bytes,
            ceiling_headers,
            heads: VecDeque::new(),
            extensions: 0,
        }
    }

    /// The next request's head, in the order the requests came; `None` once the tracker lost
    /// the framing.
    pub fn next_head(&mut self) -> Option<Head> {
        self.heads.pop_front()
    }

    /// Follows bytes as they are read from the connection, before hyper sees them.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match self.state {
                State::Lost => return,
                State::Head => {
                    // Up to the first empty line only: what follows is a body or the next head.
                    let end = (0..bytes.len()).find(|&i| ends_head(&self.head, bytes, i));
                    let take = end.map_or(bytes.len(), |i| i + 1);
                    self.head.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if end.is_some() && self.parse_head() {
                        self.head.clear();
                    } else if self.head.len() >= self.ceiling_bytes {
                        // hyper gives up on an unfinished head this long (431).
                        self.lose();
                    }
                }
                State::Length(left) => {
                    let n = left.min(bytes.len() as u64);
                    bytes = &bytes[n as usize..];
                    self.state = match left - n {
                        0 => State::Head,
                        left => State::Length(left),
                    };
                }
                State::Chunked(Chunk::Data(left)) => {
                    let n = left.min(bytes.len() as u64);
                    bytes = &bytes[n as usize..];
                    self.state = State::Chunked(match left - n {
                        0 => Chunk::DataCr,
                        left => Chunk::Data(left),
                    });
                }
                State::Chunked(chunk) => {
                    let b = bytes[0];
                    bytes = &bytes[1..];
                    self.state = match step(chunk, b, &mut self.extensions) {
                        Some(Chunk::Start) if chunk == Chunk::EndLf => State::Head,
                        Some(next) => State::Chunked(next),
                        None => State::Lost,
                    };
                }
            }
        }
    }

    /// Whether part of a head has arrived and not its end (or the tracker cannot tell).
    pub fn mid_head(&self) -> bool {
        match self.state {
            State::Head => !self.head.is_empty(),
            State::Lost => true,
            State::Length(_) | State::Chunked(_) => false,
        }
    }

    fn lose(&mut self) {
        self.state = State::Lost;
        self.head = Vec::new();
    }

    /// Parses the buffered head, which ends with an empty line; on success queues it and sets
    /// the body state. `false` when more bytes are needed (the empty line ended leading empty
    /// lines) or the tracker lost the framing.
    fn parse_head(&mut self) -> bool {
        let mut headers = vec![httparse::EMPTY_HEADER; self.ceiling_headers];
        let mut req = httparse::Request::new(&mut headers);
        let len = match req.parse(&self.head) {
            Ok(httparse::Status::Complete(len))
                if len == self.head.len() && len <= self.ceiling_bytes =>
            {
                len
            }
            Ok(httparse::Status::Partial) if self.head.len() < self.ceiling_bytes => return false,
            // Too large, too many headers or malformed: hyper answers it and closes.
            _ => {
                self.lose();
                return false;
            }
        };
        let http11 = req.version == Some(1);
        let method = req.method.unwrap_or_default().to_string();
        let target = req.path.unwrap_or_default().to_string();
        let mut lengths = Vec::new();
        let mut codings = Vec::new();
        let mut upgrade = method.eq_ignore_ascii_case("CONNECT");
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                lengths.push(h.value);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                codings.push(h.value);
            } else if h.name.eq_ignore_ascii_case("upgrade") {
                upgrade = true;
            }
        }
        let mut head = Head {
            method,
            target,
            bytes: len,
            headers: req.headers.len(),
            ambiguous: None,
        };
        if !codings.is_empty() && !lengths.is_empty() {
            head.ambiguous = Some("Content-Length and Transfer-Encoding together");
        } else if !codings.is_empty() {
            let last = codings.last().expect("not empty");
            if !http11 || !last_coding_is_chunked(last) {
                // hyper refuses these itself.
                self.lose();
                return false;
            }
            if codings.len() > 1 || !is_only_chunked(last) {
                head.ambiguous = Some("a transfer coding other than chunked alone");
            }
        }
        self.state = if head.ambiguous.is_some() || upgrade {
            // The answer closes the connection (ambiguous framing), or the bytes that follow
            // may not be HTTP (upgrade): stop here.
            State::Lost
        } else if !codings.is_empty() {
            State::Chunked(Chunk::Start)
        } else {
            let mut length = None;
            for value in &lengths {
                match (digits(value), length) {
                    (None, _) => {
                        self.lose();
                        return false;
                    }
                    (Some(n), Some(m)) if n != m => {
                        self.lose();
                        return false;
                    }
                    (n, _) => length = n,
                }
            }
            match length {
                None | Some(0) => State::Head,
                Some(n) => State::Length(n),
            }
        };
        if self.state == State::Chunked(Chunk::Start) {
            self.extensions = 0;
        }
        self.heads.push_back(head);
        true
    }
}

/// Whether `bytes[i]` ends an empty line (`\n\n` or `\n\r\n`), looking back into `head`, the
/// bytes before `bytes`.
fn ends_head(head: &[u8], bytes: &[u8], i: usize) -> bool {
    let before = |back: usize| match i.checked_sub(back) {
        Some(j) => Some(bytes[j]),
        None => head.len().checked_sub(back - i).map(|j| head[j]),
    };
    bytes[i] == b'\n'
        && (before(1) == Some(b'\n') || (before(1) == Some(b'\r') && before(2) == Some(b'\n')))
}

/// hyper's rule: the last coding of the last `Transfer-Encoding` line is `chunked`.
fn last_coding_is_chunked(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|s| {
        s.rsplit(',')
            .next()
            .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"))
    })
}

/// The one coding this server accepts: `chunked`, alone.
fn is_only_chunked(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|s| s.trim().eq_ignore_ascii_case("chunked"))
}

/// A `Content-Length` value as hyper reads it: ASCII digits only.
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// One byte through hyper's chunked decoder; `None` where hyper fails the body. After `EndLf`
/// the body is over (returned as `Start`).
fn step(chunk: Chunk, b: u8, extensions: &mut u64) -> Option<Chunk> {
    let hex = |b: u8| (b as char).to_digit(16).map(u64::from);
    Some(match chunk {
        Chunk::Start => Chunk::Size(hex(b)?),
        Chunk::Size(n) => match b {
            b'\t' | b' ' => Chunk::SizeLws(n),
            b';' => Chunk::Extension(n),
            b'\r' => Chunk::SizeLf(n),
            _ => Chunk::Size(n.checked_mul(16)?.checked_add(hex(b)?)?),
        },
        Chunk::SizeLws(n) => match b {
            b'\t' | b' ' => Chunk::SizeLws(n),
            b';' => Chunk::Extension(n),
            b'\r' => Chunk::SizeLf(n),
            _ => return None,
        },
        Chunk::Extension(n) => match b {
            b'\r' => Chunk::SizeLf(n),
            b'\n' => return None,
            _ => {
                *extensions += 1;
                if *extensions >= EXTENSION_LIMIT {
                    return None;
                }
                Chunk::Extension(n)
            }
        },
        Chunk::SizeLf(n) => match (b, n) {
            (b'\n', 0) => Chunk::EndCr,
            (b'\n', n) => Chunk::Data(n),
            _ => return None,
        },
        Chunk::Data(_) => unreachable!("data is skipped in bulk"),
        Chunk::DataCr => (b == b'\r').then_some(Chunk::DataLf)?,
        Chunk::DataLf => (b == b'\n').then_some(Chunk::Start)?,
        Chunk::EndCr => match b {
            b'\r' => Chunk::EndLf,
            _ => Chunk::Trailer,
        },
        Chunk::EndLf => (b == b'\n').then_some(Chunk::Start)?,
        Chunk::Trailer => match b {
            b'\r' => Chunk::TrailerLf,
            _ => Chunk::Trailer,
        },
        Chunk::TrailerLf => (b == b'\n').then_some(Chunk::EndCr)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads(bytes: &[&[u8]]) -> (Vec<Head>, Tracker) {
        let mut t = Tracker::new(1024, 16);
        for b in bytes {
            t.feed(b);
        }
        let mut out = Vec::new();
        while let Some(h) = t.next_head() {
            out.push(h);
        }
        (out, t)
    }

    fn targets(hs: &[Head]) -> Vec<&str> {
        hs.iter().map(|h| h.target.as_str()).collect()
    }

    #[test]
    fn bodies_are_skipped_by_length_and_by_chunks_in_any_split() {
        let stream: &[u8] = b"POST /a HTTP/1.1\r\nContent-Length: 12\r\n\r\nGET /x HTTP/1.1\
            POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
            5;ext=1\r\nGET /\r\n3\r\nyyy\r\n0\r\nTrailer: t\r\n\r\n\
            GET /c HTTP/1.1\r\nHost: h\r\n\r\n";
        let (whole, _) = heads(&[stream]);
        assert_eq!(targets(&whole), ["/a", "/b", "/c"]);
        assert_eq!(whole[0].bytes, 40);
        assert_eq!(whole[2].headers, 1);
        // Byte by byte, the same heads.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        let (dripped, _) = heads(&bytes);
        assert_eq!(dripped, whole);
    }

    #[test]
    fn length_with_chunked_and_extra_codings_are_ambiguous_and_end_the_tracking() {
        for (head, why) in [
            (
                "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                "Content-Length and Transfer-Encoding together",
            ),
            (
                "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
                "Content-Length and Transfer-Encoding together",
            ),
            (
                "Transfer-Encoding: gzip, chunked\r\n",
                "a transfer coding other than chunked alone",
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                "a transfer coding other than chunked alone",
            ),
        ] {
            let stream =
                format!("POST /a HTTP/1.1\r\n{head}\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n");
            let (hs, _) = heads(&[stream.as_bytes()]);
            assert_eq!(targets(&hs), ["/a"], "{head:?}");
            assert_eq!(hs[0].ambiguous, Some(why), "{head:?}");
        }
        let (hs, _) = heads(&[b"POST /a HTTP/1.1\r\nTransfer-Encoding: Chunked \r\n\r\n0\r\n\r\n"]);
        assert_eq!(
            hs[0].ambiguous, None,
            "case and spaces around chunked are fine"
        );
    }

    #[test]
    fn what_hyper_refuses_stops_the_tracking() {
        for stream in [
            &b"POST /a HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nGET /b HTTP/1.1\r\n\r\n"[..],
            b"POST /a HTTP/1.1\r\nContent-Length: +3\r\n\r\nabcGET /b HTTP/1.1\r\n\r\n",
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
            b"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
            b"GET /a HTTP/1.1\r\nBad Header: x\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
        ] {
            let (hs, t) = heads(&[stream]);
            assert!(hs.is_empty(), "{}", String::from_utf8_lossy(stream));
            assert_eq!(t.state, State::Lost);
        }
        // A broken chunk: the request before it is known, nothing after it.
        let (hs, t) = heads(&[
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
        ]);
        assert_eq!(targets(&hs), ["/a"]);
        assert_eq!(t.state, State::Lost);
    }

    #[test]
    fn heads_are_measured_up_to_the_ceiling() {
        let big = format!("GET /a HTTP/1.1\r\nX: {}\r\n\r\n", "v".repeat(900));
        let (hs, _) = heads(&[big.as_bytes()]);
        assert_eq!(hs[0].bytes, big.len());
        let over = format!("GET /a HTTP/1.1\r\nX: {}\r\n\r\n", "v".repeat(1100));
        let (hs, t) = heads(&[over.as_bytes()]);
        assert!(hs.is_empty());
        assert_eq!(t.state, State::Lost);
        // An unfinished head past the ceiling is given up without waiting for its end.
        let (_, t) = heads(&[&[b'a'; 1100]]);
        assert_eq!(t.state, State::Lost);
        let many: String = (0..16).map(|i| format!("X{i}: v\r\n")).collect();
        let (hs, _) = heads(&[format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()]);
        assert_eq!(hs[0].headers, 16);
        let (hs, t) = heads(&[format!("GET / HTTP/1.1\r\n{many}Y: v\r\n\r\n").as_bytes()]);
        assert!(hs.is_empty());
        assert_eq!(t.state, State::Lost);
    }

    #[test]
    fn leading_empty_lines_count_as_hyper_counts_them() {
        let (hs, _) = heads(&[b"\r\n\r\nGET /a HTTP/1.1\r\n\r\n"]);
        assert_eq!(targets(&hs), ["/a"]);
        assert_eq!(hs[0].bytes, 4 + 19);
    }
}
