//! The client of the REST API of a coordinator (or of `cairn run --rest`), over `ureq`.
//!
//! http, and https with the `tls` feature (rustls with the Mozilla root certificates), one
//! deadline for connecting and one for the whole answer, no proxy and no redirects. Every
//! failure is one line: the
//! server could not be reached, did not answer in time, wants a token, or answered with
//! Flink's `{"errors":[..]}` (whose messages become the error).

use std::io::ErrorKind;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use serde_json::Value;

/// Where the client commands look for the REST API unless told otherwise.
pub const DEFAULT_REST: &str = "http://127.0.0.1:8081";

/// How long connecting, and then receiving a whole answer, may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer read, in bytes (a checkpoint history is far smaller).
const ANSWER_MAX: u64 = 64 << 20;

/// `--rest` and `--rest-token` of the client commands.
#[derive(Args, Debug, Clone)]
pub struct RestArgs {
    /// REST API of the coordinator (or of `run --rest`): http://HOST:PORT, https://HOST:PORT, HOST:PORT, or PORT on 127.0.0.1.
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

/// Where the REST API is: `http[s]://HOST:PORT[/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Whether the API is spoken over TLS.
    https: bool,
    /// Host name or address; an IPv6 address without brackets.
    host: String,
    port: u16,
    /// Path prefix without a trailing `/` (usually empty).
    prefix: String,
}

impl Endpoint {
    /// Parses `http://HOST[:PORT][/PREFIX]` (port 80 by default), the same with `https://`
    /// (port 443), `HOST:PORT` (http), or a bare `PORT`/`:PORT` (on 127.0.0.1, as
    /// `cairn run --rest PORT` binds).
    pub fn parse(text: &str) -> Result<Endpoint> {
        let t = text.trim();
        let bad = |why: &str| {
            anyhow!("--rest expects http://HOST:PORT, https://HOST:PORT, HOST:PORT or PORT (e.g. {DEFAULT_REST}), got '{text}': {why}")
        };
        let (scheme, rest) = match t.split_once("://") {
            Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
            None => (None, t),
        };
        let https = match scheme.as_deref() {
            None | Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(bad(&format!("unsupported scheme '{other}'"))),
        };
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
                return Endpoint::checked(false, "127.0.0.1".into(), port, prefix, bad);
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
            (None, true) if https => 443,
            (None, true) => 80,
            (None, false) => return Err(bad("no port")),
        };
        Endpoint::checked(https, host.to_string(), port, prefix, bad)
    }

    fn checked(
        https: bool,
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
        Ok(Endpoint {
            https,
            host,
            port,
            prefix,
        })
    }

    /// `host:port` as URLs spell it.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL, for messages and as the base of requests.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority(), self.prefix)
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
    /// Made for `timeout`; its connections are reused between requests.
    agent: ureq::Agent,
}

impl Client {
    /// A client of the REST API at `rest` (see [`Endpoint::parse`]), sending `token` if given.
    pub fn new(rest: &str, token: Option<&str>) -> Result<Client> {
        let endpoint = Endpoint::parse(rest)?;
        if endpoint.https && !cfg!(feature = "tls") {
            bail!("--rest {rest}: https needs cairn-app built with the 'tls' feature");
        }
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
            agent: agent(TIMEOUT),
        })
    }

    /// The same client with another deadline for the answer (connecting still takes at most
    /// [`TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self.agent = agent(timeout);
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
        let mut request = ureq::http::Request::builder()
            .method(method.as_str())
            .uri(format!("{url}{path}"));
        if let Some(t) = &self.token {
            request = request.header("Authorization", format!("Bearer {t}"));
        }
        let bad_request = |e: ureq::http::Error| anyhow!("cannot request {url}{path}: {e}");
        let sent = match body {
            Some(body) => self.agent.run(
                request
                    .header("Content-Type", "application/json")
                    .body(body.to_string())
                    .map_err(bad_request)?,
            ),
            None => self.agent.run(request.body(()).map_err(bad_request)?),
        };
        let mut response = sent.map_err(|e| self.failure(e))?;
        let status = response.status();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(ANSWER_MAX)
            .read_to_vec()
            .map_err(|e| self.failure(e))?;
        answer(
            status.as_u16(),
            status.canonical_reason().unwrap_or_default(),
            &bytes,
            &url,
            self.token.is_some(),
        )
    }

    /// A failed exchange as one line naming the coordinator.
    fn failure(&self, e: ureq::Error) -> anyhow::Error {
        let url = self.url();
        let unreachable = |why: &str| anyhow!("cannot reach coordinator at {url}: {why}");
        match e {
            ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => {
                unreachable(&format!("no connection within {}s", TIMEOUT.as_secs()))
            }
            ureq::Error::Timeout(_) => anyhow!(
                "no answer from coordinator at {url} within {}s",
                self.timeout.as_secs()
            ),
            ureq::Error::HostNotFound => unreachable("the host name has no address"),
            ureq::Error::ConnectionFailed => unreachable("the connection failed"),
            ureq::Error::Io(e) if broken(e.kind()) => anyhow!(
                "lost the connection to coordinator at {url}: {}",
                io_message(&e)
            ),
            // rustls reports a failed handshake as invalid data.
            ureq::Error::Io(e) if self.endpoint.https && e.kind() == ErrorKind::InvalidData => {
                anyhow!("TLS with coordinator at {url} failed: {}", io_message(&e))
            }
            // Refused, unreachable, or a host name that does not resolve.
            ureq::Error::Io(e) => unreachable(&io_message(&e)),
            ureq::Error::Protocol(_) | ureq::Error::LargeResponseHeader(..) => {
                anyhow!("unexpected answer from coordinator at {url}: not an HTTP answer")
            }
            ureq::Error::BodyExceedsLimit(_) => anyhow!(
                "unexpected answer from coordinator at {url}: larger than {} MiB",
                ANSWER_MAX >> 20
            ),
            ureq::Error::Tls(why) => anyhow!("TLS with coordinator at {url} failed: {why}"),
            #[cfg(feature = "tls")]
            ureq::Error::Rustls(e) => anyhow!("TLS with coordinator at {url} failed: {e}"),
            other => anyhow!("request to coordinator at {url} failed: {other}"),
        }
    }
}

/// An HTTP client that connects within [`TIMEOUT`] and gives up on an answer after `timeout`.
fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        // Every status is an answer to read: Flink's errors come with 4xx and 5xx.
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .timeout_connect(Some(TIMEOUT))
        .timeout_global(Some(timeout))
        .user_agent(concat!("cairn/", env!("CARGO_PKG_VERSION")))
        .accept("application/json")
        .build()
        .into()
}

/// Whether an I/O error of this kind means a connection was made and then broke.
fn broken(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
    )
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

/// The JSON body of a 2xx answer (null if empty), or the error of another status as one line.
fn answer(status: u16, reason: &str, body: &[u8], url: &str, token_given: bool) -> Result<Value> {
    let json = if body.iter().all(u8::is_ascii_whitespace) {
        Ok(Value::Null)
    } else {
        serde_json::from_slice::<Value>(body)
    };
    if (200..300).contains(&status) {
        return json
            .map_err(|e| anyhow!("unexpected answer from coordinator at {url}: not JSON ({e})"));
    }
    if status == 401 {
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
        bail!("coordinator at {url} answered {status} {}", reason.trim());
    }
    bail!("{}", errors.join("; ").replace(['\r', '\n'], " "))
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
        assert_eq!(ep("https://h.example").url(), "https://h.example:443");
        assert_eq!(ep("HTTPS://h:8443/api").url(), "https://h:8443/api");
        assert!(ep("https://h:1").https && !ep("h:1").https);
    }

    #[test]
    fn bad_urls_are_refused_with_a_reason() {
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

    fn result(status: u16, reason: &str, body: &[u8], token: bool) -> Result<Value> {
        answer(status, reason, body, "http://h:1", token)
    }

    #[test]
    fn errors_become_one_line() {
        let e = result(
            404,
            "Not Found",
            br#"{"errors":["job abc not found"]}"#,
            false,
        )
        .expect_err("404");
        assert_eq!(e.to_string(), "job abc not found");
        let e = result(400, "Bad Request", br#"{"errors":["a\nb","c"]}"#, false).expect_err("400");
        assert_eq!(e.to_string(), "a b; c");
        let e = result(401, "Unauthorized", b"{}", false).expect_err("401");
        assert_eq!(
            e.to_string(),
            "the REST API requires a token (--rest-token)"
        );
        let e = result(401, "Unauthorized", b"{}", true).expect_err("401");
        assert!(e.to_string().contains("rejected the token"), "{e}");
        let e = result(502, "Bad Gateway", b"<html>", false).expect_err("502");
        assert_eq!(
            e.to_string(),
            "coordinator at http://h:1 answered 502 Bad Gateway"
        );
        let e = result(200, "OK", b"<html>", false).expect_err("not JSON");
        assert!(e.to_string().contains("not JSON"), "{e}");
        assert_eq!(result(202, "Accepted", b"", false).ok(), Some(Value::Null));
        assert_eq!(
            result(200, "OK", br#"{"a":1}"#, false).ok(),
            Some(serde_json::json!({"a": 1}))
        );
    }
}
