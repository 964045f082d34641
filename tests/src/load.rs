//! Clients at a fixed rate inside a pod, counting what they see: the proof that a proxy
//! restart, a hand-over or a control-plane outage costs no request.
//!
//! A client GETs `/` every `every`, over one keep-alive connection — checked before each
//! use and replaced when the server asked to close it or closed it between requests, as
//! an HTTP client's pool does — or over a new connection per request. A request that
//! fails or gets anything but 200 is a failure, counted in the phase that was current
//! when it started (tests that have none use phase 0).

use ambit_proxy::netns::Netns;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// An HTTP/1.1 client connection.
pub type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// Connects from the pod at `netns` to `dst` (an application's connection: redirected to
/// the node proxy), in 5 s at most.
pub async fn connect(netns: &Netns, dst: SocketAddr) -> Result<Sender, String> {
    let stream = tokio::time::timeout(Duration::from_secs(5), netns.connect(dst, 0))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(send)
}

/// One GET of `/`: the status, and whether the server asked to close the connection.
pub async fn get(send: &mut Sender, host: &str) -> Result<(u16, bool), String> {
    let req = http::Request::get("/")
        .header("host", host)
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(5), send.send_request(req))
        .await
        .map_err(|_| "no response in 5 s".to_string())?
        .map_err(|e| format!("request: {e}"))?;
    let close = resp
        .headers()
        .get(http::header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let status = resp.status().as_u16();
    resp.into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    Ok((status, close))
}

/// Until a GET from the pod at `from` to `to` is served (30 s at most).
pub async fn until_served(from: &Path, to: SocketAddr) {
    let netns = Netns::open(from).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tried = match connect(&netns, to).await {
            Ok(mut send) => get(&mut send, &to.to_string()).await,
            Err(e) => Err(e),
        };
        match tried {
            Ok((200, _)) => return,
            other => assert!(Instant::now() < deadline, "{to} never served: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one client saw.
#[derive(Debug)]
pub struct Load {
    ok: Vec<AtomicU64>,
    connections: AtomicU64,
    failed: Mutex<Vec<(usize, String)>>,
}

impl Load {
    /// Requests served in `phase`.
    pub fn ok(&self, phase: usize) -> u64 {
        self.ok.get(phase).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Requests served in all phases.
    pub fn total_ok(&self) -> u64 {
        self.ok.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Connections opened (a keep-alive client's count shows how often it was moved).
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// The failures of `phase`.
    pub fn failed(&self, phase: usize) -> Vec<String> {
        let failed = self.failed.lock().unwrap();
        failed
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Every failure.
    pub fn all_failed(&self) -> Vec<String> {
        let failed = self.failed.lock().unwrap();
        failed.iter().map(|(_, e)| e.clone()).collect()
    }
}

/// A client's settings.
#[derive(Clone, Debug)]
pub struct Client {
    /// The pod's netns path.
    pub netns: PathBuf,
    /// Where to.
    pub dst: SocketAddr,
    /// One keep-alive connection, or a new connection per request.
    pub keepalive: bool,
    /// A request every.
    pub every: Duration,
    /// The current phase, read when each request starts.
    pub phase: Arc<AtomicUsize>,
    /// How many phases there are.
    pub phases: usize,
}

impl Client {
    /// A client with one phase.
    pub fn new(netns: PathBuf, dst: SocketAddr, keepalive: bool, every: Duration) -> Self {
        Self {
            netns,
            dst,
            keepalive,
            every,
            phase: Arc::default(),
            phases: 1,
        }
    }

    /// Runs the client until `stop` turns true.
    pub fn start(self, stop: watch::Receiver<bool>) -> Arc<Load> {
        let seen = Arc::new(Load {
            ok: (0..self.phases).map(|_| AtomicU64::new(0)).collect(),
            connections: AtomicU64::new(0),
            failed: Mutex::default(),
        });
        let counts = seen.clone();
        tokio::spawn(async move {
            let netns = Netns::open(&self.netns).unwrap();
            let host = self.dst.to_string();
            let mut every = tokio::time::interval(self.every);
            let mut conn: Option<Sender> = None;
            while !*stop.borrow() {
                every.tick().await;
                let now = self.phase.load(Ordering::SeqCst);
                let fail = |e: String| counts.failed.lock().unwrap().push((now, e));
                if let Some(send) = &mut conn {
                    if send.ready().await.is_err() {
                        conn = None;
                    }
                }
                let send = match &mut conn {
                    Some(send) => send,
                    None => match connect(&netns, self.dst).await {
                        Ok(send) => {
                            counts.connections.fetch_add(1, Ordering::Relaxed);
                            conn.insert(send)
                        }
                        Err(e) => {
                            fail(e);
                            continue;
                        }
                    },
                };
                match get(send, &host).await {
                    Ok((200, close)) => {
                        if let Some(c) = counts.ok.get(now) {
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                        if close || !self.keepalive {
                            conn = None;
                        }
                    }
                    Ok((status, _)) => {
                        fail(format!("status {status}"));
                        conn = None;
                    }
                    Err(e) => {
                        fail(e);
                        conn = None;
                    }
                }
            }
        });
        seen
    }
}
