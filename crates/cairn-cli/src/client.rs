//! A small HTTP/1.1 client for the REST API of a coordinator (or of `cairn run --rest`).
//!
//! One request per connection (`Connection: close`) over `std::net::TcpStream`, with a
//! deadline on connecting and on the whole answer. Every failure is one line: the server could
//! not be reached, did not answer in time, wants a token, or answered with Flink's
//! `{"errors":[..]}` (whose messages become the error).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use serde_json::Value;

/// Where the client commands look for the REST API unless told otherwise.
pub const DEFAULT_REST: &str = "http://127.0.0.1:8081";

/// How long connecting, and then receiving a whole answer, may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer read, in bytes (a checkpoint history is far smaller).
const ANSWER_MAX: usize = 64 << 20;

/// `--rest` and `--rest-token` of the client commands.
#[derive(Args, Debug, Clone)]
pub struct RestArgs {
    /// REST API of the coordinator (or of `cairn run --rest`): http://HOST:PORT, HOST:PORT, or PORT on 127.0.0.1.
    #[arg(long, value_name = "URL", default_value = DEFAULT_REST)]
    pub rest: String,
    /// Bearer token, if the REST API requires one.
    #[arg(long, value_name = "TOKEN")]
    pub rest_token: Option<String>,
}

impl RestArgs {
    /// A client for these arguments, with the default timeout.
    pub fn client(&self) -> Result<Client> {
        Client::new(&self.rest, self.rest_token.as_deref())
    }
}

/// Where the REST API is: `http://HOST:PORT[/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Host name or address; an IPv6 address without brackets.
    host: String,
    port: u16,
    /// Path prefix without a trailing `/` (usually empty).
    prefix: String,
}

impl Endpoint {
    /// Parses `http://HOST[:PORT][/PREFIX]` (port 80 by default), `HOST:PORT`, or a bare
    /// `PORT`/`:PORT` (on 127.0.0.1, as `cairn run --rest PORT` binds).
    pub fn parse(text: &str) -> Result<Endpoint> {
        let t = text.trim();
        let bad = |why: &str| {
            anyhow!("--rest expects http://HOST:PORT, HOST:PORT or PORT (e.g. {DEFAULT_REST}), got '{text}': {why}")
        };
        let (scheme, rest) = match t.split_once("://") {
            Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
            None => (None, t),
        };
        match scheme.as_deref() {
            None | Some("http") => {}
            Some("https") => bail!(
                "--rest {t}: https is not supported by the cairn client; use http://HOST:PORT (put a TLS proxy in front for remote access)"
            ),
            Some(other) => return Err(bad(&format!("unsupported scheme '{other}'"))),
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let prefix = path.trim_end_matches('/').to_string();
        if prefix
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
        {
            return Err(bad("the path must not contain spaces, '?' or '#'"));
        }
        if scheme.is_none() {
            if let Ok(port) = authority.strip_prefix(':').unwrap_or(authority).parse() {
                return Endpoint::checked("127.0.0.1".into(), port, prefix, bad);
            }
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("missing ']'"))?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        let port = match (port, scheme.is_some()) {
            (Some(p), _) => p.parse().map_err(|_| bad(&format!("bad port '{p}'")))?,
            (None, true) => 80,
            (None, false) => return Err(bad("no port")),
        };
        Endpoint::checked(host.to_string(), port, prefix, bad)
    }

    fn checked(
        host: String,
        port: u16,
        prefix: String,
        bad: impl Fn(&str) -> anyhow::Error,
    ) -> Result<Endpoint> {
        if port == 0 {
            return Err(bad("port 0"));
        }
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
        if !host_ok {
            return Err(bad(&format!("bad host '{host}'")));
        }
        Ok(Endpoint { host, port, prefix })
    }

    /// `host:port` as the `Host` header and URLs spell it.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL, for messages.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.authority(), self.prefix)
    }
}

/// An HTTP method the client uses.
#[derive(Debug, Clone, Copy)]
pub enum Method {
    Get,
    Post,
    Patch,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Patch => "PATCH",
        }
    }
}

/// A client of one REST API.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    token: Option<String>,
    timeout: Duration,
}

impl Client {
    /// A client of the REST API at `rest` (see [`Endpoint::parse`]), sending `token` if given.
    pub fn new(rest: &str, token: Option<&str>) -> Result<Client> {
        let endpoint = Endpoint::parse(rest)?;
        if let Some(t) = token {
            if t.trim().is_empty() {
                bail!("--rest-token must not be empty");
            }
            if t.chars().any(char::is_control) {
                bail!("--rest-token must not contain control characters");
            }
        }
        Ok(Client {
            endpoint,
            token: token.map(|t| t.trim().to_string()),
            timeout: TIMEOUT,
        })
    }

    /// The same client with another deadline for the answer (connecting still takes at most
    /// [`TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The URL of the REST API, for messages.
    pub fn url(&self) -> String {
        self.endpoint.url()
    }

    /// `GET path`: the JSON answer of a 2xx.
    pub fn get(&self, path: &str) -> Result<Value> {
        self.request(Method::Get, path, None)
    }

    /// One request; the JSON answer of a 2xx (null if empty), or the error as one line.
    pub fn request(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value> {
        let url = self.url();
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut stream = self.connect()?;
        let raw = self.exchange(&mut stream, method, path, &body)?;
        let answer = Answer::parse(&raw)
            .map_err(|why| anyhow!("unexpected answer from coordinator at {url}: {why}"))?;
        answer.into_result(&url, self.token.is_some())
    }

    fn connect(&self) -> Result<TcpStream> {
        let url = self.url();
        let unreachable = |why: String| anyhow!("cannot reach coordinator at {url}: {why}");
        let addrs: Vec<SocketAddr> = (self.endpoint.host.as_str(), self.endpoint.port)
            .to_socket_addrs()
            .map_err(|e| unreachable(io_message(&e)))?
            .collect();
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, TIMEOUT) {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        Err(unreachable(match last {
            Some(e) if e.kind() == ErrorKind::TimedOut => {
                format!("no connection within {}s", TIMEOUT.as_secs())
            }
            Some(e) => io_message(&e),
            None => "the host name has no address".into(),
        }))
    }

    /// Sends the request and reads the whole answer (the server closes the connection).
    fn exchange(
        &self,
        stream: &mut TcpStream,
        method: Method,
        path: &str,
        body: &str,
    ) -> Result<Vec<u8>> {
        let url = self.url();
        let deadline = Instant::now() + self.timeout;
        let timed_out = || {
            anyhow!(
                "no answer from coordinator at {url} within {}s",
                self.timeout.as_secs()
            )
        };
        let failed = |e: std::io::Error| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => timed_out(),
            _ => anyhow!(
                "lost the connection to coordinator at {url}: {}",
                io_message(&e)
            ),
        };
        let auth = self
            .token
            .as_ref()
            .map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let content_type = if body.is_empty() {
            ""
        } else {
            "Content-Type: application/json\r\n"
        };
        let head = format!(
            "{} {}{path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: cairn/{}\r\nAccept: application/json\r\n{auth}{content_type}Content-Length: {}\r\nConnection: close\r\n\r\n",
            method.as_str(),
            self.endpoint.prefix,
            self.endpoint.authority(),
            env!("CARGO_PKG_VERSION"),
            body.len(),
        );
        stream
            .set_write_timeout(Some(self.timeout))
            .map_err(failed)?;
        stream
            .write_all(&[head.as_bytes(), body.as_bytes()].concat())
            .map_err(failed)?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            stream.set_read_timeout(Some(left)).map_err(failed)?;
            match stream.read(&mut buf) {
                Ok(0) => return Ok(raw),
                Ok(n) => {
                    raw.extend_from_slice(&buf[..n]);
                    if raw.len() > ANSWER_MAX {
                        bail!(
                            "unexpected answer from coordinator at {url}: larger than {} MiB",
                            ANSWER_MAX >> 20
                        );
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // A reset after a complete answer (the server closed with unread input).
                Err(e) if e.kind() == ErrorKind::ConnectionReset && Answer::parse(&raw).is_ok() => {
                    return Ok(raw)
                }
                Err(e) => return Err(failed(e)),
            }
        }
    }
}

/// The OS's message without Rust's " (os error N)" suffix.
fn io_message(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    }
}

/// `s` as one path segment: everything but unreserved characters percent-encoded.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A parsed HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    reason: String,
    body: Vec<u8>,
}

impl Answer {
    /// Parses a whole answer: status line, headers, and a body by `Content-Length`, chunked, or
    /// up to the end.
    fn parse(raw: &[u8]) -> Result<Answer, String> {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| {
                if raw.is_empty() {
                    "the connection was closed without an answer".to_string()
                } else {
                    "not an HTTP answer".to_string()
                }
            })?;
        let head = std::str::from_utf8(&raw[..split]).map_err(|_| "not an HTTP answer")?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        let status = parts
            .next()
            .and_then(|s| s.parse::<u16>().ok())
            .filter(|_| version.starts_with("HTTP/1."))
            .ok_or("not an HTTP answer")?;
        let reason = parts.next().unwrap_or_default().to_string();
        let mut length = None;
        let mut chunked = false;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.parse::<usize>().map_err(|_| "bad Content-Length")?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            }
        }
        let rest = &raw[split + 4..];
        let body = if chunked {
            dechunk(rest)?
        } else if let Some(n) = length {
            rest.get(..n).ok_or("the answer was cut short")?.to_vec()
        } else {
            rest.to_vec()
        };
        Ok(Answer {
            status,
            reason,
            body,
        })
    }

    /// The JSON body of a 2xx, or the error of another status as one line.
    fn into_result(self, url: &str, token_given: bool) -> Result<Value> {
        let json = if self.body.iter().all(u8::is_ascii_whitespace) {
            Ok(Value::Null)
        } else {
            serde_json::from_slice::<Value>(&self.body)
        };
        if (200..300).contains(&self.status) {
            return json.map_err(|e| {
                anyhow!("unexpected answer from coordinator at {url}: not JSON ({e})")
            });
        }
        if self.status == 401 {
            if token_given {
                bail!("the REST API at {url} rejected the token given with --rest-token");
            }
            bail!("the REST API requires a token (--rest-token)");
        }
        let errors: Vec<String> = json
            .ok()
            .and_then(|v| v.get("errors").and_then(Value::as_array).cloned())
            .unwrap_or_default()
            .iter()
            .map(|e| match e {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        if errors.is_empty() {
            bail!(
                "coordinator at {url} answered {} {}",
                self.status,
                self.reason.trim()
            );
        }
        bail!("{}", errors.join("; ").replace(['\r', '\n'], " "))
    }
}

/// The body of a chunked answer.
fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let cut = || "the answer was cut short".to_string();
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n").ok_or_else(cut)?;
        let size_text = std::str::from_utf8(&data[..eol]).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| "bad chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        let start = eol + 2;
        let chunk = data.get(start..start + size).ok_or_else(cut)?;
        out.extend_from_slice(chunk);
        data = data.get(start + size + 2..).ok_or_else(cut)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(text: &str) -> Endpoint {
        Endpoint::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn err(text: &str) -> String {
        Endpoint::parse(text).expect_err(text).to_string()
    }

    #[test]
    fn urls_and_addresses() {
        assert_eq!(ep("http://127.0.0.1:8081").url(), "http://127.0.0.1:8081");
        assert_eq!(ep("http://127.0.0.1:8081/").url(), "http://127.0.0.1:8081");
        assert_eq!(
            ep("HTTP://Host-1.example:9").url(),
            "http://Host-1.example:9"
        );
        assert_eq!(ep("http://localhost").url(), "http://localhost:80");
        assert_eq!(ep("localhost:8081").url(), "http://localhost:8081");
        assert_eq!(ep(" 8081 ").url(), "http://127.0.0.1:8081");
        assert_eq!(ep(":8082").url(), "http://127.0.0.1:8082");
        assert_eq!(ep("[::1]:8081").url(), "http://[::1]:8081");
        assert_eq!(ep("[::1]:8081").host, "::1");
        let p = ep("http://proxy:80/flink/");
        assert_eq!(
            (p.prefix.as_str(), p.url()),
            ("/flink", "http://proxy:80/flink".into())
        );
    }

    #[test]
    fn bad_urls_are_refused_with_a_reason() {
        let https = err("https://127.0.0.1:8081");
        assert!(https.contains("https is not supported"), "{https}");
        assert!(err("ftp://x:1").contains("unsupported scheme 'ftp'"));
        assert!(err("localhost").contains("no port"));
        assert!(err("localhost:http").contains("bad port 'http'"));
        assert!(err("127.0.0.1:0").contains("port 0"));
        assert!(err("127.0.0.1:99999").contains("bad port"));
        assert!(err("http://:8081").contains("bad host ''"));
        assert!(err("http://a b:8081").contains("bad host"));
        assert!(err("http://user@h:1").contains("bad host"));
        assert!(err("http://h:1/a?b").contains("path"));
        assert!(err("[::1:8081").contains("missing ']'"));
        assert!(err("nope").starts_with("--rest expects http://HOST:PORT"));
    }

    #[test]
    fn tokens_are_checked() {
        let e = Client::new("1", Some(" ")).expect_err("empty token");
        assert_eq!(e.to_string(), "--rest-token must not be empty");
        let e = Client::new("1", Some("a\r\nX: y")).expect_err("header injection");
        assert!(e.to_string().contains("control characters"));
        assert!(Client::new("1", Some("t0k3n")).is_ok());
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("0123abcdef"), "0123abcdef");
        assert_eq!(segment("a/b?c d%"), "a%2Fb%3Fc%20d%25");
        assert_eq!(segment("ü\r\n"), "%C3%BC%0D%0A");
    }

    #[test]
    fn answers_by_length_chunked_and_to_the_end() {
        let a = Answer::parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}xx").expect("ok");
        assert_eq!((a.status, a.body.as_slice()), (200, &b"{}"[..]));
        let a = Answer::parse(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
        )
        .expect("chunked");
        assert_eq!(a.body, br#"{"a":1}"#);
        let a = Answer::parse(b"HTTP/1.0 404 Not Found\r\n\r\n{\"errors\":[]}").expect("ok");
        assert_eq!((a.status, a.reason.as_str()), (404, "Not Found"));
        assert!(Answer::parse(b"").is_err());
        assert!(Answer::parse(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(Answer::parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(
            Answer::parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab").is_err()
        );
    }

    fn result(raw: &[u8], token: bool) -> Result<Value> {
        Answer::parse(raw)
            .expect("parses")
            .into_result("http://h:1", token)
    }

    #[test]
    fn errors_become_one_line() {
        let e = result(
            b"HTTP/1.1 404 Not Found\r\n\r\n{\"errors\":[\"job abc not found\"]}",
            false,
        )
        .expect_err("404");
        assert_eq!(e.to_string(), "job abc not found");
        let e = result(
            b"HTTP/1.1 400 Bad Request\r\n\r\n{\"errors\":[\"a\\nb\",\"c\"]}",
            false,
        )
        .expect_err("400");
        assert_eq!(e.to_string(), "a b; c");
        let e = result(b"HTTP/1.1 401 Unauthorized\r\n\r\n{}", false).expect_err("401");
        assert_eq!(
            e.to_string(),
            "the REST API requires a token (--rest-token)"
        );
        let e = result(b"HTTP/1.1 401 Unauthorized\r\n\r\n{}", true).expect_err("401");
        assert!(e.to_string().contains("rejected the token"), "{e}");
        let e = result(b"HTTP/1.1 502 Bad Gateway\r\n\r\n<html>", false).expect_err("502");
        assert_eq!(
            e.to_string(),
            "coordinator at http://h:1 answered 502 Bad Gateway"
        );
        let e = result(b"HTTP/1.1 200 OK\r\n\r\n<html>", false).expect_err("not JSON");
        assert!(e.to_string().contains("not JSON"), "{e}");
        assert_eq!(
            result(b"HTTP/1.1 202 Accepted\r\n\r\n", false).ok(),
            Some(Value::Null)
        );
    }
}
