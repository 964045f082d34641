//! The clients: one process per client pod, started in the pod's network namespace and its
//! node's cgroup as a container is (so that the node's eBPF programs take its connections
//! to the node proxy), an unmodified application sending each kind of traffic at a fixed
//! rate until its standard input closes (the orchestrator's end, or its death).
//!
//! It reports on standard output, one JSON object a line: `{"ready": true}` once every
//! kind has been served once (the warm-up, not counted), `{"counts": {kind: [ok, failed,
//! slow, max_ms, retried]}}` every second, `{"fail": kind, "error": ...}` for each of the first
//! [`REPORTED`] failures of a kind, and `{"done": true}` at the end.

use crate::cluster::{sock, CHURN, DB, GRPC, WEB};
use ambit_api::proto::identity::identity_client::IdentityClient;
use ambit_api::proto::identity::CertifyRequest;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{timeout, MissedTickBehavior};

/// The kinds of traffic, in report order.
pub const KINDS: [&str; 7] = [
    "http1_keepalive",
    "http1_newconn",
    "http2",
    "grpc",
    "tcp",
    "tcp_stream",
    "churn_http1",
];

/// Failures of one kind printed with their error (all are counted).
pub const REPORTED: u64 = 20;
/// How long a request (or an opaque exchange) may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A request slower than this is counted as slow (served, but noticed).
const SLOW: Duration = Duration::from_secs(1);
/// Bytes each opaque connection sends and reads back.
const TCP_BYTES: usize = 4096;
/// The long opaque stream's chunk, and how often one is sent.
const CHUNK: usize = 1024;
const CHUNK_EVERY: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug)]
enum Kind {
    Http1KeepAlive,
    Http1NewConn,
    Http2,
    Grpc,
    Tcp,
    TcpStream,
    Churn,
}

/// The load process's flags.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// The client pod's name (in reports).
    #[arg(long)]
    pub name: String,
    /// Requests per second of each HTTP and gRPC kind (opaque connections and the churn
    /// Service get half of it).
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Seconds each long opaque stream lasts before it is closed and opened again.
    #[arg(long, default_value_t = 55)]
    pub stream_secs: u64,
}

#[derive(Debug, Default)]
struct Count {
    ok: AtomicU64,
    failed: AtomicU64,
    slow: AtomicU64,
    max_ms: AtomicU64,
    /// Requests a closing connection gave back unsent, sent again on a new one.
    retried: AtomicU64,
}

#[derive(Debug, Default)]
struct Counts([Count; KINDS.len()]);

impl Counts {
    /// Records one request of `kind` (`took`: its latency; none for a whole stream).
    fn record(&self, kind: Kind, took: Option<Duration>, result: Result<(), String>) {
        let c = &self.0[kind as usize];
        if let Some(took) = took {
            c.max_ms
                .fetch_max(took.as_millis() as u64, Ordering::Relaxed);
            if took >= SLOW {
                c.slow.fetch_add(1, Ordering::Relaxed);
            }
        }
        match result {
            Ok(()) => {
                c.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                if c.failed.fetch_add(1, Ordering::Relaxed) < REPORTED {
                    emit(&json!({"fail": KINDS[kind as usize], "error": error}));
                }
            }
        }
    }

    fn json(&self) -> Value {
        let kinds: serde_json::Map<String, Value> = KINDS
            .iter()
            .zip(&self.0)
            .map(|(name, c)| {
                let v = [&c.ok, &c.failed, &c.slow, &c.max_ms, &c.retried]
                    .map(|a| a.load(Ordering::Relaxed));
                (name.to_string(), json!(v))
            })
            .collect();
        json!({ "counts": kinds })
    }
}

/// One report line on standard output (a closed pipe is ignored: the orchestrator is gone).
fn emit(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// A fixed rate, until stopped.
struct Pace {
    every: tokio::time::Interval,
    stop: watch::Receiver<bool>,
}

impl Pace {
    fn new(per_sec: f64, stop: watch::Receiver<bool>) -> Self {
        let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec.max(0.1)));
        every.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self { every, stop }
    }

    /// Waits for the next tick; false once stopped.
    async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.every.tick() => !*self.stop.borrow(),
            _ = self.stop.changed() => false,
        }
    }
}

/// The load process: warm-up, then every kind at its rate until standard input closes.
pub fn main(args: LoadArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: LoadArgs) -> anyhow::Result<()> {
    let (stop_tx, stop) = watch::channel(false);
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        stop_tx.send_replace(true);
    });
    if let Err(e) = warm_up(&stop).await {
        emit(&json!({"error": format!("{}: warm-up: {e}", args.name)}));
        anyhow::bail!("warm-up: {e}");
    }
    emit(&json!({"ready": true}));
    let counts = Arc::new(Counts::default());
    let rate = args.rate;
    let pace = |r: f64| Pace::new(r, stop.clone());
    let c = || counts.clone();
    let tasks = vec![
        tokio::spawn(http1(
            sock(WEB),
            true,
            Kind::Http1KeepAlive,
            c(),
            pace(rate),
        )),
        tokio::spawn(http1(sock(WEB), false, Kind::Http1NewConn, c(), pace(rate))),
        tokio::spawn(http2(sock(WEB), c(), pace(rate))),
        tokio::spawn(grpc(
            grpc_client().map_err(anyhow::Error::msg)?,
            c(),
            pace(rate),
        )),
        tokio::spawn(tcp(c(), pace(rate / 2.0))),
        tokio::spawn(streams(args.stream_secs, c(), stop.clone())),
        tokio::spawn(http1(sock(CHURN), true, Kind::Churn, c(), pace(rate / 2.0))),
    ];
    let reporter = {
        let counts = counts.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            loop {
                every.tick().await;
                emit(&counts.json());
            }
        })
    };
    for t in tasks {
        let _ = t.await;
    }
    reporter.abort();
    emit(&counts.json());
    emit(&json!({"done": true}));
    Ok(())
}

/// Until each kind has been served once (three minutes at most): the mesh has the pods,
/// their certificates and the Services. Not counted.
async fn warm_up(stop: &watch::Receiver<bool>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut grpc_client = grpc_client()?;
    let unused = AtomicU64::new(0);
    for what in ["http1", "http2", "grpc", "tcp", "churn"] {
        loop {
            let tried = timeout(REQUEST_TIMEOUT, async {
                match what {
                    "http1" => http1_once(&mut None, sock(WEB), false, &unused).await,
                    "http2" => http2_once(&mut None, sock(WEB), &unused).await,
                    "grpc" => grpc_once(&mut grpc_client).await,
                    "tcp" => tcp_once(sock(DB), 0).await,
                    _ => http1_once(&mut None, sock(CHURN), false, &unused).await,
                }
            })
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
            match tried {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline || *stop.borrow() => {
                    return Err(format!("{what}: {e}"))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    Ok(())
}

/// The outcome of `op`, or a failure if it takes longer than [`REQUEST_TIMEOUT`].
async fn timed<F: std::future::Future<Output = Result<(), String>>>(
    op: F,
) -> (Duration, Result<(), String>) {
    let started = Instant::now();
    let result = timeout(REQUEST_TIMEOUT, op)
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {REQUEST_TIMEOUT:?}")));
    (started.elapsed(), result)
}

async fn connect(dst: SocketAddr) -> Result<TcpStream, String> {
    timeout(Duration::from_secs(5), TcpStream::connect(dst))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))
}

/// A response as the servers give it: 200 and `ok <server>`. Whether the server asked to
/// close the connection.
async fn check(resp: http::Response<hyper::body::Incoming>) -> Result<bool, String> {
    let status = resp.status();
    let close = resp
        .headers()
        .get(http::header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let why = resp
        .headers()
        .get("ambit-proxy-error")
        .map(|v| format!(" ({})", String::from_utf8_lossy(v.as_bytes())))
        .unwrap_or_default();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{status}: body: {e}"))?
        .to_bytes();
    if status != http::StatusCode::OK || !body.starts_with(b"ok ") {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(format!("status {status}{why}: {text}"));
    }
    Ok(close)
}

type Http1 = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;
type Request = http::Request<Empty<Bytes>>;

/// One GET over `conn` (opened if there is none, replaced if the server closed it or
/// asked to, as an HTTP client's pool does), dropped after the request unless `keepalive`.
/// A request the connection gave back unsent — it was closing: the server's close raced
/// the request — is sent once more on a new connection, as a client's pool does, and
/// counted in `retried`.
async fn http1_once(
    conn: &mut Option<Http1>,
    dst: SocketAddr,
    keepalive: bool,
    retried: &AtomicU64,
) -> Result<(), String> {
    let mut req = http::Request::get("/")
        .header(http::header::HOST, dst.to_string())
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    loop {
        if let Some(send) = conn.as_mut() {
            if send.ready().await.is_err() {
                *conn = None;
            }
        }
        if conn.is_none() {
            let io = TokioIo::new(connect(dst).await?);
            let (send, task) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(task);
            *conn = Some(send);
        }
        let send = conn.as_mut().ok_or("no connection")?;
        match send.try_send_request(req).await {
            Ok(resp) => {
                let close = check(resp).await?;
                if close || !keepalive {
                    *conn = None;
                }
                return Ok(());
            }
            Err(e) => {
                *conn = None;
                req = unsent(e, retried)?;
            }
        }
    }
}

/// Marks a request sent a second time (never a third).
const RETRIED: &str = "x-soak-retried";

/// After a failed send: the request, if the connection gave it back unsent and it has not
/// been sent again yet (counted in `retried`); else the failure.
fn unsent(
    mut e: hyper::client::conn::TrySendError<Request>,
    retried: &AtomicU64,
) -> Result<Request, String> {
    match e.take_message() {
        Some(mut req) if !req.headers().contains_key(RETRIED) => {
            retried.fetch_add(1, Ordering::Relaxed);
            req.headers_mut()
                .insert(RETRIED, http::HeaderValue::from_static("1"));
            Ok(req)
        }
        _ => Err(format!("request: {}", e.error())),
    }
}

async fn http1(dst: SocketAddr, keepalive: bool, kind: Kind, counts: Arc<Counts>, mut pace: Pace) {
    let mut conn = None;
    let retried = &counts.0[kind as usize].retried;
    while pace.next().await {
        let (took, result) = timed(http1_once(&mut conn, dst, keepalive, retried)).await;
        if result.is_err() {
            conn = None;
        }
        counts.record(kind, Some(took), result);
    }
}

type Http2 = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// One GET over the HTTP/2 connection (prior knowledge), opened again when it has closed
/// (after a GOAWAY); a request the closing connection gave back unsent is sent once more
/// on a new one, as a client's pool does, and counted in `retried`.
async fn http2_once(
    conn: &mut Option<Http2>,
    dst: SocketAddr,
    retried: &AtomicU64,
) -> Result<(), String> {
    let mut req = http::Request::get(format!("http://{dst}/"))
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    loop {
        if let Some(send) = conn.as_mut() {
            if send.ready().await.is_err() {
                *conn = None;
            }
        }
        if conn.is_none() {
            let io = TokioIo::new(connect(dst).await?);
            let (send, task) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(task);
            *conn = Some(send);
        }
        let send = conn.as_mut().ok_or("no connection")?;
        match send.try_send_request(req).await {
            Ok(resp) => return check(resp).await.map(drop),
            Err(e) => {
                *conn = None;
                req = unsent(e, retried)?;
            }
        }
    }
}

async fn http2(dst: SocketAddr, counts: Arc<Counts>, mut pace: Pace) {
    let mut conn = None;
    let retried = &counts.0[Kind::Http2 as usize].retried;
    while pace.next().await {
        let (took, result) = timed(http2_once(&mut conn, dst, retried)).await;
        if result.is_err() {
            conn = None;
        }
        counts.record(Kind::Http2, Some(took), result);
    }
}

/// A gRPC client of the `grpc` Service: one channel, which reconnects by itself.
fn grpc_client() -> Result<IdentityClient<tonic::transport::Channel>, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{GRPC}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy();
    Ok(IdentityClient::new(channel))
}

async fn grpc_once(client: &mut IdentityClient<tonic::transport::Channel>) -> Result<(), String> {
    client
        .certify(CertifyRequest::default())
        .await
        .map(drop)
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

async fn grpc(
    mut client: IdentityClient<tonic::transport::Channel>,
    counts: Arc<Counts>,
    mut pace: Pace,
) {
    while pace.next().await {
        let (took, result) = timed(grpc_once(&mut client)).await;
        counts.record(Kind::Grpc, Some(took), result);
    }
}

/// One opaque connection: [`TCP_BYTES`] sent, the same read back, then closed by both.
async fn tcp_once(dst: SocketAddr, n: u64) -> Result<(), String> {
    let mut s = connect(dst).await?;
    let data: Vec<u8> = (0..TCP_BYTES as u64)
        .map(|i| (i.wrapping_mul(31).wrapping_add(n) % 251) as u8)
        .collect();
    s.write_all(&data)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut got = vec![0u8; TCP_BYTES];
    s.read_exact(&mut got)
        .await
        .map_err(|e| format!("echo: {e}"))?;
    if got != data {
        return Err("echo differs from what was sent".into());
    }
    s.shutdown().await.map_err(|e| format!("close: {e}"))?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .await
        .map_err(|e| format!("after close: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes more than sent", rest.len()));
    }
    Ok(())
}

async fn tcp(counts: Arc<Counts>, mut pace: Pace) {
    let mut n = 0;
    while pace.next().await {
        n += 1;
        let (took, result) = timed(tcp_once(sock(DB), n)).await;
        counts.record(Kind::Tcp, Some(took), result);
    }
}

/// The byte at `pos` of a long stream.
fn stream_byte(pos: u64) -> u8 {
    (pos % 251) as u8
}

/// One long opaque stream: a [`CHUNK`] every [`CHUNK_EVERY`] for `secs` (or until stopped),
/// each byte checked as it comes back; then a half-close and the echo read to its end.
async fn stream_once(secs: u64, stop: &watch::Receiver<bool>) -> Result<(), String> {
    let s = connect(sock(DB)).await?;
    let (mut r, mut w) = s.into_split();
    let until = Instant::now() + Duration::from_secs(secs);
    let send = async {
        let mut pos = 0u64;
        while Instant::now() < until && !*stop.borrow() {
            let chunk: Vec<u8> = (pos..pos + CHUNK as u64).map(stream_byte).collect();
            w.write_all(&chunk)
                .await
                .map_err(|e| format!("write after {pos} bytes: {e}"))?;
            pos += CHUNK as u64;
            tokio::time::sleep(CHUNK_EVERY).await;
        }
        w.shutdown()
            .await
            .map_err(|e| format!("close after {pos} bytes: {e}"))?;
        Ok::<u64, String>(pos)
    };
    let recv = async {
        let mut pos = 0u64;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = r
                .read(&mut buf)
                .await
                .map_err(|e| format!("read after {pos} bytes: {e}"))?;
            if n == 0 {
                return Ok::<u64, String>(pos);
            }
            if buf[..n]
                .iter()
                .enumerate()
                .any(|(i, b)| *b != stream_byte(pos + i as u64))
            {
                return Err(format!("echo corrupted after {pos} bytes"));
            }
            pos += n as u64;
        }
    };
    let limit = Duration::from_secs(secs) + REQUEST_TIMEOUT;
    let (sent, got) = timeout(limit, async { tokio::join!(send, recv) })
        .await
        .map_err(|_| "the stream did not end".to_string())?;
    let (sent, got) = (sent?, got?);
    if sent != got {
        return Err(format!("sent {sent} bytes, {got} came back"));
    }
    Ok(())
}

async fn streams(secs: u64, counts: Arc<Counts>, stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        let result = stream_once(secs, &stop).await;
        let failed = result.is_err();
        counts.record(Kind::TcpStream, None, result);
        if failed {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
