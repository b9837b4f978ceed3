//! The admin HTTP endpoint (`keel.admin.listen`): `GET /stats` answers the
//! broker's counters as JSON, `GET /metrics` the same and the request
//! stage histograms in Prometheus' text format, `GET /healthz` answers
//! `ok`, anything else 404 (405 for another method on those paths).
//!
//! A broker started with `KEEL_FAILPOINTS=1` (tests only) also serves its
//! storage fault injection (`keel_log::faults`): `GET /failpoints` lists the
//! rules, `POST /failpoints/add?<rule>` adds one (the rule's text, with `+`
//! or `%20` for spaces), `POST /failpoints/clear` removes them all.
//!
//! A deliberately small HTTP/1.1 server: one request per connection, no
//! request bodies, no keep-alive. It may face the same network as the Kafka
//! listener, so every connection is bounded: the request head must arrive
//! within `Limits::timeout` and fit in `Limits::head_bytes`, the response
//! is written under a deadline of the same length, and at most
//! `Limits::connections` are served at once (more are closed on accept). A
//! slow or hostile client costs one task and one socket for a few seconds;
//! the broker's own work never waits on this module.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
#[cfg(test)]
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::{timeout_at, Instant};

/// The JSON `GET /stats` answers, produced afresh for every request. It is
/// called on a blocking thread.
pub type StatsSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// The text `GET /metrics` answers, produced afresh for every request, on
/// a blocking thread.
pub type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

/// What the endpoint serves, and to whom.
#[derive(Clone)]
pub struct Handlers {
    pub stats: StatsSource,
    pub metrics: MetricsSource,
    /// The broker's fault injection, when it was started with it.
    pub failpoints: Option<keel_log::faults::FaultyStorage>,
    /// The `Authorization` values that are let in (every path but
    /// `/healthz`); none: everyone.
    pub auth: Auth,
    /// TLS (`keel.admin.ssl.enabled`), with the ADMIN listener's keys.
    pub tls: Option<Arc<crate::tls::Reloading>>,
}

/// Who may read the endpoint: `keel.admin.auth.bearer.token` and
/// `keel.admin.auth.basic.credentials` (`user:password`).
#[derive(Clone, Default)]
pub struct Auth {
    accepted: Vec<String>,
}

impl Auth {
    pub fn new(bearer_token: &str, basic_credentials: &str) -> Auth {
        let mut accepted = Vec::new();
        if !bearer_token.is_empty() {
            accepted.push(format!("Bearer {bearer_token}"));
        }
        if !basic_credentials.is_empty() {
            accepted.push(format!("Basic {}", base64(basic_credentials.as_bytes())));
        }
        Auth { accepted }
    }

    pub fn is_open(&self) -> bool {
        self.accepted.is_empty()
    }

    /// Whether a request with this `Authorization` value is let in; the
    /// comparison takes the same time wherever the first difference is.
    fn admits(&self, authorization: Option<&str>) -> bool {
        if self.accepted.is_empty() {
            return true;
        }
        let Some(given) = authorization else {
            return false;
        };
        self.accepted.iter().any(|a| {
            a.len() == given.len() && a.bytes().zip(given.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
        })
    }
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, &b| (n << 8) | u32::from(b)) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Bounds on what one admin connection may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request head (request line and headers) accepted.
    pub head_bytes: usize,
    /// Deadline for the whole request head to arrive, and again for the
    /// response to be written: a total, so trickling bytes does not extend
    /// it.
    pub timeout: Duration,
    /// Connections served at once.
    pub connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            head_bytes: 8 * 1024,
            timeout: Duration::from_secs(5),
            connections: 32,
        }
    }
}

/// After answering, unread request bytes are drained (up to this many, for
/// at most this long) so that closing the socket does not reset the
/// connection before the client has read the answer.
const DRAIN_BYTES: usize = 1 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Serves admin requests until the task is dropped.
pub async fn serve(listener: TcpListener, handlers: Handlers, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                    tracing::debug!(%peer, "admin: too many connections, closing this one");
                    continue;
                };
                let handlers = handlers.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    let served = match handlers.tls.as_ref().map(|t| t.acceptor()) {
                        None => connection(stream, &handlers, limits).await,
                        Some(acceptor) => {
                            match timeout_at(Instant::now() + limits.timeout, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => connection(tls, &handlers, limits).await,
                                Ok(Err(e)) => Err(e),
                                Err(_) => Err(std::io::Error::other("no TLS handshake in time")),
                            }
                        }
                    };
                    if let Err(e) = served {
                        tracing::debug!(%peer, error = %e, "admin connection failed");
                    }
                });
            }
            Err(e) => {
                // Typically EMFILE: back off instead of spinning.
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    handlers: &Handlers,
    limits: Limits,
) -> std::io::Result<()> {
    let deadline = Instant::now() + limits.timeout;
    let response = match read_head(&mut stream, limits.head_bytes, deadline).await {
        Ok(head) => match parse_request(&head) {
            Ok(route)
                if route != Route::Healthz && !handlers.auth.admits(authorization(&head).as_deref()) =>
            {
                Response::refusal(Refusal::Unauthorized)
            }
            Ok(route) => {
                // The stats measure page-cache residency with a syscall per
                // segment file: off the async threads.
                let handlers = handlers.clone();
                match tokio::task::spawn_blocking(move || answer(route, &handlers)).await {
                    Ok(response) => response,
                    Err(e) => return Err(std::io::Error::other(e.to_string())),
                }
            }
            Err(refusal) => Response::refusal(refusal),
        },
        Err(HeadError::Closed) => return Ok(()),
        Err(HeadError::Io(e)) => return Err(e),
        Err(HeadError::Refused(refusal)) => Response::refusal(refusal),
    };
    let deadline = Instant::now() + limits.timeout;
    let write = async {
        stream.write_all(&response.to_bytes()).await?;
        stream.shutdown().await
    };
    match timeout_at(deadline, write).await {
        Ok(result) => result?,
        Err(_) => return Err(std::io::Error::other("response not read in time")),
    }
    drain(&mut stream).await;
    Ok(())
}

async fn drain<S: AsyncRead + Unpin>(stream: &mut S) {
    let mut scratch = [0u8; 4096];
    let mut left = DRAIN_BYTES;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Why a request gets no 200.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Malformed(&'static str),
    TooLarge,
    TimedOut,
    NotFound,
    /// With the method the path takes.
    MethodNotAllowed(&'static str),
    /// No `Authorization` the endpoint accepts.
    Unauthorized,
}

#[derive(Debug)]
enum HeadError {
    /// The client closed the connection without sending anything.
    Closed,
    Io(std::io::Error),
    Refused(Refusal),
}

/// Reads up to and excluding the blank line that ends the request head.
/// Bytes after it (a body, pipelined requests) are left unread.
async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    max_bytes: usize,
    deadline: Instant,
) -> Result<Vec<u8>, HeadError> {
    let mut buf = vec![0u8; max_bytes];
    let mut len = 0;
    loop {
        if len == max_bytes {
            return Err(HeadError::Refused(Refusal::TooLarge));
        }
        let n = match timeout_at(deadline, stream.read(&mut buf[len..])).await {
            Err(_) => return Err(HeadError::Refused(Refusal::TimedOut)),
            Ok(Err(e)) => return Err(HeadError::Io(e)),
            Ok(Ok(0)) if len == 0 => return Err(HeadError::Closed),
            Ok(Ok(0)) => return Err(HeadError::Refused(Refusal::Malformed("incomplete request head"))),
            Ok(Ok(n)) => n,
        };
        // The terminator may straddle two reads.
        let from = len.saturating_sub(3);
        len += n;
        if let Some(end) = find(&buf[from..len], b"\r\n\r\n") {
            buf.truncate(from + end);
            return Ok(buf);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// What a well-formed request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Stats,
    Metrics,
    Healthz,
    Failpoints,
    AddFailpoint(String),
    ClearFailpoints,
}

/// Parses a request head (without its final blank line): the request line
/// `METHOD SP TARGET SP HTTP/1.x` and `name: value` header lines. Header
/// values are not interpreted; a query string is ignored.
fn parse_request(head: &[u8]) -> Result<Route, Refusal> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    let request_line =
        std::str::from_utf8(request_line).map_err(|_| Refusal::Malformed("request line is not text"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed("expected `METHOD TARGET HTTP/1.1`"));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(Refusal::Malformed("bad method"));
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refusal::Malformed("bad request target"));
    }
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Err(Refusal::Malformed("not HTTP/1.x"));
    }
    for line in lines {
        if !is_header_line(line) {
            return Err(Refusal::Malformed("bad header line"));
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (route, wanted) = match path {
        "/stats" => (Route::Stats, "GET"),
        "/metrics" => (Route::Metrics, "GET"),
        "/healthz" => (Route::Healthz, "GET"),
        "/failpoints" => (Route::Failpoints, "GET"),
        "/failpoints/add" => (
            Route::AddFailpoint(percent_decode(query).ok_or(Refusal::Malformed("bad rule encoding"))?),
            "POST",
        ),
        "/failpoints/clear" => (Route::ClearFailpoints, "POST"),
        _ => return Err(Refusal::NotFound),
    };
    if method != wanted {
        return Err(Refusal::MethodNotAllowed(wanted));
    }
    Ok(route)
}

/// A query string's text: `+` is a space, `%XX` a byte.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The value of the request's `Authorization` header, if it has one.
fn authorization(head: &[u8]) -> Option<String> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_string())
    })
}

/// `name: value`, the name a non-empty token (RFC 9110 `tchar`s).
fn is_header_line(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    let name = &line[..colon];
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn answer(route: Route, handlers: &Handlers) -> Response {
    let failpoints = || {
        handlers
            .failpoints
            .as_ref()
            .ok_or_else(|| Response::text(404, "not found: start the broker with KEEL_FAILPOINTS=1\n"))
    };
    match route {
        Route::Healthz => Response::text(200, "ok\n"),
        Route::Metrics => Response {
            status: 200,
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body: (handlers.metrics)().into_bytes(),
            allow: None,
            challenge: None,
        },
        Route::Failpoints => match failpoints() {
            Ok(f) => Response::text(200, &(f.describe().join("\n") + "\n")),
            Err(r) => r,
        },
        Route::AddFailpoint(rule) => match failpoints() {
            Ok(f) => match f.add_text(&rule) {
                Ok(n) => {
                    tracing::warn!(%rule, "failpoint added");
                    Response::text(200, &format!("added {n}\n"))
                }
                Err(e) => Response::text(400, &format!("bad rule: {e}\n")),
            },
            Err(r) => r,
        },
        Route::ClearFailpoints => match failpoints() {
            Ok(f) => {
                f.clear();
                Response::text(200, "cleared\n")
            }
            Err(r) => r,
        },
        Route::Stats => match serde_json::to_vec_pretty(&(handlers.stats)()) {
            Ok(mut body) => {
                body.push(b'\n');
                Response {
                    status: 200,
                    content_type: "application/json",
                    body,
                    allow: None,
                    challenge: None,
                }
            }
            Err(e) => Response::text(500, &format!("cannot encode the stats: {e}\n")),
        },
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    /// Adds `Allow: <method>` (required with 405).
    allow: Option<&'static str>,
    /// Adds `WWW-Authenticate: <challenge>` (with 401).
    challenge: Option<&'static str>,
}

impl Response {
    fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
            allow: None,
            challenge: None,
        }
    }

    fn refusal(refusal: Refusal) -> Response {
        match refusal {
            Refusal::Malformed(why) => Response::text(400, &format!("bad request: {why}\n")),
            Refusal::TooLarge => Response::text(400, "bad request: request head too large\n"),
            Refusal::TimedOut => Response::text(408, "request head not received in time\n"),
            Refusal::NotFound => Response::text(404, "not found: try /stats, /metrics or /healthz\n"),
            Refusal::MethodNotAllowed(allowed) => Response {
                allow: Some(allowed),
                ..Response::text(405, &format!("method not allowed: use {allowed}\n"))
            },
            Refusal::Unauthorized => Response {
                challenge: Some("Bearer realm=\"keel\", Basic realm=\"keel\""),
                ..Response::text(
                    401,
                    "unauthorized: send the bearer token or the basic credentials\n",
                )
            },
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            _ => "Internal Server Error",
        };
        let mut allow = self.allow.map(|m| format!("Allow: {m}\r\n")).unwrap_or_default();
        if let Some(challenge) = self.challenge {
            allow.push_str(&format!("WWW-Authenticate: {challenge}\r\n"));
        }
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    #[test]
    fn request_heads_parse_or_are_refused() {
        let ok = |head: &str| parse_request(head.as_bytes());
        assert_eq!(
            ok("GET /stats HTTP/1.1\r\nHost: x\r\nAccept: */*"),
            Ok(Route::Stats)
        );
        assert_eq!(ok("GET /healthz HTTP/1.0"), Ok(Route::Healthz));
        assert_eq!(ok("GET /stats?pretty=1 HTTP/1.1\nHost: x"), Ok(Route::Stats));
        assert_eq!(ok("GET /metrics HTTP/1.1"), Ok(Route::Metrics));
        assert_eq!(ok("GET /metric HTTP/1.1"), Err(Refusal::NotFound));
        assert_eq!(ok("POST /stats HTTP/1.1"), Err(Refusal::MethodNotAllowed("GET")));
        assert_eq!(
            ok("POST /failpoints/add?sync+eio+path%3Dt-0 HTTP/1.1"),
            Ok(Route::AddFailpoint("sync eio path=t-0".into()))
        );
        assert_eq!(
            ok("GET /failpoints/clear HTTP/1.1"),
            Err(Refusal::MethodNotAllowed("POST"))
        );
        assert!(matches!(
            ok("POST /failpoints/add?%zz HTTP/1.1"),
            Err(Refusal::Malformed(_))
        ));
        for bad in [
            "",
            "GET",
            "GET /stats",
            "GET /stats HTTP/2",
            "GET  /stats HTTP/1.1",
            "get /stats HTTP/1.1",
            "GET stats HTTP/1.1",
            "GET /stats HTTP/1.1 extra",
            "GET /stats HTTP/1.1\r\nno colon",
            "GET /stats HTTP/1.1\r\n: empty name",
            "GET /stats HTTP/1.1\r\nbad name: x",
        ] {
            assert!(matches!(ok(bad), Err(Refusal::Malformed(_))), "{bad:?}");
        }
        assert!(matches!(
            parse_request(b"\xff\xfe /stats HTTP/1.1"),
            Err(Refusal::Malformed(_))
        ));
    }

    async fn start(limits: Limits) -> SocketAddr {
        start_with(limits, Auth::default()).await
    }

    async fn start_with(limits: Limits, auth: Auth) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats: StatsSource = Arc::new(|| serde_json::json!({"tail_cache": {"used_bytes": 7}}));
        let handlers = Handlers {
            stats,
            metrics: Arc::new(|| "# TYPE keel_requests counter\n# EOF\n".to_string()),
            failpoints: None,
            auth,
            tls: None,
        };
        tokio::spawn(serve(listener, handlers, limits));
        addr
    }

    /// Sends `request`, half-closes, and returns everything the server sent
    /// before closing (a reset ends the answer too).
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if s.write_all(request).await.is_ok() {
            let _ = s.shutdown().await;
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8(out).unwrap()
    }

    fn status(response: &str) -> &str {
        response.get(9..12).unwrap_or(response)
    }

    #[tokio::test]
    async fn answers_stats_healthz_and_refusals() {
        let addr = start(Limits::default()).await;
        let r = exchange(addr, b"GET /stats HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(status(&r), "200", "{r}");
        assert!(r.contains("Content-Type: application/json\r\n"), "{r}");
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}\r\n", body.len())),
            "{r}"
        );
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["tail_cache"]["used_bytes"], 7);

        let r = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!((status(&r), r.split_once("\r\n\r\n").unwrap().1), ("200", "ok\n"));
        let r = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "200", "{r}");
        assert!(
            r.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
            "{r}"
        );
        assert!(r.ends_with("# TYPE keel_requests counter\n# EOF\n"), "{r}");
        let r = exchange(addr, b"GET /nope HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "404");
        let r = exchange(addr, b"DELETE /stats HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "405");
        assert!(r.contains("Allow: GET\r\n"), "{r}");
        let r = exchange(addr, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n").await;
        assert_eq!(status(&r), "400");
        let r = exchange(addr, b"GET /stats HTTP/1.1\r\nHost").await;
        assert_eq!(status(&r), "400", "incomplete head");
        assert_eq!(exchange(addr, b"").await, "", "nothing sent, nothing answered");
    }

    #[test]
    fn base64_is_the_standard_one() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("ops:s3cr3t!", "b3BzOnMzY3IzdCE="),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[tokio::test]
    async fn a_token_or_credentials_guard_everything_but_healthz() {
        let addr = start_with(Limits::default(), Auth::new("t0ken", "ops:s3cr3t!")).await;
        let get = |path: &str, auth: &str| {
            let header = if auth.is_empty() {
                String::new()
            } else {
                format!("Authorization: {auth}\r\n")
            };
            format!("GET {path} HTTP/1.1\r\nHost: x\r\n{header}\r\n")
        };
        for (path, auth, expected) in [
            ("/stats", "", "401"),
            ("/metrics", "Bearer wrong", "401"),
            ("/metrics", "Bearer t0ken1", "401"),
            ("/stats", "Bearer t0ken", "200"),
            ("/metrics", "Basic b3BzOnMzY3IzdCE=", "200"),
            ("/healthz", "", "200"),
        ] {
            let response = exchange(addr, get(path, auth).as_bytes()).await;
            assert_eq!(status(&response), expected, "{path} {auth}: {response}");
            if expected == "401" {
                assert!(
                    response.contains("WWW-Authenticate: Bearer realm=\"keel\""),
                    "{response}"
                );
            }
        }
    }

    #[tokio::test]
    async fn keel_stats_reads_the_endpoint() {
        let addr = start(Limits::default()).await;
        let admin = addr.to_string();
        let body = tokio::task::spawn_blocking(move || crate::stats::fetch(&admin, "/stats"))
            .await
            .unwrap()
            .unwrap();
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["tail_cache"]["used_bytes"], 7);
        let admin = addr.to_string();
        let e = tokio::task::spawn_blocking(move || crate::stats::fetch(&admin, "/nope"))
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(e, crate::stats::FetchError::Status { status: 404, .. }),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn an_oversized_head_is_refused_and_its_answer_arrives() {
        let addr = start(Limits::default()).await;
        let mut request = b"GET /stats HTTP/1.1\r\n".to_vec();
        request.extend(std::iter::repeat_n(b"X-Pad: 0123456789abcdef\r\n", 4000).flatten());
        request.extend_from_slice(b"\r\n");
        let r = exchange(addr, &request).await;
        assert_eq!(status(&r), "400", "{r}");
        assert!(r.contains("too large"), "{r}");
    }

    #[tokio::test]
    async fn a_trickled_head_times_out_on_the_total_deadline() {
        let limits = Limits {
            timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let addr = start(limits).await;
        let started = std::time::Instant::now();
        let s = TcpStream::connect(addr).await.unwrap();
        let (mut read, mut write) = s.into_split();
        // One byte every 20 ms for 10 s: each read arrives well within the
        // timeout, only the total deadline can end this.
        let trickle = tokio::spawn(async move {
            for b in b"GET /stats HTTP/1.1\r\nX-Slow: ".iter().cycle().take(500) {
                if write.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let mut out = Vec::new();
        read.read_to_end(&mut out).await.unwrap();
        trickle.abort();
        assert_eq!(status(&String::from_utf8(out).unwrap()), "408");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_closed_at_once() {
        let limits = Limits {
            connections: 2,
            timeout: Duration::from_secs(60),
            ..Limits::default()
        };
        let addr = start(limits).await;
        let mut stalled = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /stats HTTP/1.1\r\n").await.unwrap();
            stalled.push(s);
        }
        // Connections are accepted in order, so both slots are taken by the
        // time the next one is accepted.
        let r = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(r, "", "a third connection is closed unanswered");
        drop(stalled);
        let r = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let r = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
                if !r.is_empty() {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("slots are freed when the stalled clients leave");
        assert_eq!(status(&r), "200");
    }
}
