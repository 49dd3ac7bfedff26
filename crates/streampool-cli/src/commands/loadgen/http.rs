//! A minimal HTTP/1.1 client connection for the load generator: one keep-alive connection,
//! one request at a time (no pipelining), responses framed by `Content-Length` or chunked
//! transfer encoding. The request bytes are written as given (built once, before the run),
//! the response head is parsed with `httparse` (hyper's parser), and the body stays in the
//! connection's buffer for the checker to read: nothing is copied or allocated per request
//! once the buffer has grown to the largest response.
//!
//! Written by hand rather than with hyper's client: the load generator must cost less CPU
//! than the server it loads, and this is the least work a client can do per request.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most response headers parsed (the server sends about five).
const MAX_HEADERS: usize = 32;
/// Initial read-buffer size; it grows to the largest response seen.
const INITIAL_BUFFER: usize = 16 << 10;

/// One answered request: its status, whether the server will close the connection, and the
/// bytes it took on the wire.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub status: u16,
    /// The server said `Connection: close` (or spoke HTTP/1.0): reconnect before the next.
    pub close: bool,
    /// Response bytes read (head and body).
    pub bytes: usize,
}

/// A keep-alive connection.
pub struct Conn {
    stream: TcpStream,
    /// Bytes read; `buf[..filled]` holds data.
    buf: Vec<u8>,
    filled: usize,
    /// Where the last response's body lies in `buf` (content-length framing), or `None`
    /// when it was chunked and lies in `chunked`.
    body: Option<(usize, usize)>,
    chunked: Vec<u8>,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

impl Conn {
    /// Connects to `addr` (Nagle off: requests are one write each).
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: vec![0; INITIAL_BUFFER],
            filled: 0,
            body: None,
            chunked: Vec::new(),
        })
    }

    /// The body of the last answer.
    pub fn body(&self) -> &[u8] {
        match self.body {
            Some((a, b)) => &self.buf[a..b],
            None => &self.chunked,
        }
    }

    /// Writes `request` (a complete HTTP/1.1 request) and reads its answer.
    pub async fn send(&mut self, request: &[u8]) -> io::Result<Answer> {
        // No pipelining: whatever the previous answer left unread is not ours.
        self.filled = 0;
        self.body = Some((0, 0));
        self.chunked.clear();
        self.stream.write_all(request).await?;
        self.read_answer().await
    }

    /// Reads more bytes, growing the buffer when full; end of stream is an error (an answer
    /// was cut short).
    async fn fill(&mut self) -> io::Result<()> {
        if self.filled == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = self.stream.read(&mut self.buf[self.filled..]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before a full response",
            ));
        }
        self.filled += n;
        Ok(())
    }

    /// Ensures `buf[..upto]` is read.
    async fn fill_to(&mut self, upto: usize) -> io::Result<()> {
        if self.buf.len() < upto {
            self.buf.resize(upto.next_power_of_two(), 0);
        }
        while self.filled < upto {
            self.fill().await?;
        }
        Ok(())
    }

    async fn read_answer(&mut self) -> io::Result<Answer> {
        // The head: parse what is there, read more while it is partial.
        let (status, close, head_len, framing) = loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut resp = httparse::Response::new(&mut headers);
            match resp
                .parse(&self.buf[..self.filled])
                .map_err(|e| bad(format!("bad response head: {e}")))?
            {
                httparse::Status::Partial => self.fill().await?,
                httparse::Status::Complete(head_len) => {
                    let status = resp.code.unwrap_or(0);
                    let mut close = resp.version == Some(0);
                    let mut framing = Framing::UntilClose;
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            let n = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .ok_or_else(|| bad("bad Content-Length"))?;
                            framing = Framing::Length(n);
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            if contains_token(h.value, b"chunked") {
                                framing = Framing::Chunked;
                            }
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            close = contains_token(h.value, b"close");
                        }
                    }
                    // Statuses that never carry a body.
                    if status < 200 || status == 204 || status == 304 {
                        framing = Framing::Length(0);
                    }
                    break (status, close, head_len, framing);
                }
            }
        };
        let end = match framing {
            Framing::Length(n) => {
                self.fill_to(head_len + n).await?;
                self.body = Some((head_len, head_len + n));
                head_len + n
            }
            Framing::Chunked => {
                let end = self.read_chunked(head_len).await?;
                self.body = None;
                end
            }
            Framing::UntilClose => {
                loop {
                    match self.fill().await {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                        Err(e) => return Err(e),
                    }
                }
                self.body = Some((head_len, self.filled));
                return Ok(Answer {
                    status,
                    close: true,
                    bytes: self.filled,
                });
            }
        };
        Ok(Answer {
            status,
            close,
            bytes: end,
        })
    }

    /// Decodes a chunked body starting at `at` into `self.chunked`; returns where the
    /// message ends.
    async fn read_chunked(&mut self, mut at: usize) -> io::Result<usize> {
        loop {
            let line_end = loop {
                if let Some(i) = find_crlf(&self.buf[at..self.filled]) {
                    break at + i;
                }
                self.fill().await?;
            };
            let line = &self.buf[at..line_end];
            let hex = line.split(|&b| b == b';').next().unwrap_or(line);
            let size = std::str::from_utf8(hex)
                .ok()
                .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
                .ok_or_else(|| bad("bad chunk size"))?;
            at = line_end + 2;
            if size == 0 {
                // Trailers (none expected), then the blank line.
                loop {
                    let end = loop {
                        if let Some(i) = find_crlf(&self.buf[at..self.filled]) {
                            break at + i;
                        }
                        self.fill().await?;
                    };
                    let blank = end == at;
                    at = end + 2;
                    if blank {
                        return Ok(at);
                    }
                }
            }
            self.fill_to(at + size + 2).await?;
            self.chunked.extend_from_slice(&self.buf[at..at + size]);
            if &self.buf[at + size..at + size + 2] != b"\r\n" {
                return Err(bad("chunk not followed by CRLF"));
            }
            at += size + 2;
        }
    }
}

enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

/// Whether the comma-separated header value holds `token` (case-insensitive).
fn contains_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// A plain GET on a fresh connection (for `/metrics` and `/health`): the status and body.
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> io::Result<(u16, Vec<u8>)> {
    let mut conn = Conn::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let answer = conn.send(req.as_bytes()).await?;
    Ok((answer.status, conn.body().to_vec()))
}
