//! `ambit demo app load`: a bounded load generator. It sends `GET --target` at a fixed
//! rate with at most `--concurrency` requests in flight: a tick that finds them all busy
//! is skipped, not queued, so a slow or stuck target never builds a backlog that would
//! burst out later. Every 10 s it prints what the last 10 s looked like.

use super::{get, http_client};
use hyper::Uri;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{interval, interval_at, Instant, MissedTickBehavior};

/// Flags of `ambit demo app load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// The URL to GET, e.g. http://10.96.0.10:8080/.
    #[arg(long)]
    pub target: Uri,
    /// Requests per second.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub rps: u32,
    /// Most requests in flight at once; a request due when all are busy is skipped.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,
}

/// How long one request may take, its body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a summary line is printed.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// What happened over some time. A request still in flight at shutdown is `sent` only.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Requests started.
    pub sent: u64,
    /// Requests answered with a 2xx status.
    pub ok: u64,
    /// Requests answered otherwise, or not at all.
    pub failed: u64,
    /// Ticks skipped because `--concurrency` requests were in flight.
    pub skipped: u64,
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            sent,
            ok,
            failed,
            skipped,
        } = self;
        write!(
            f,
            "sent {sent}, ok {ok}, failed {failed}, skipped {skipped}"
        )
    }
}

/// Sends load to `--target` until `shutdown`; returns the totals.
pub async fn run(args: LoadArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<Counts> {
    let client = http_client();
    let target = args.target;
    let send = move || {
        let (client, target) = (client.clone(), target.clone());
        async move {
            match get(&client, target, REQUEST_TIMEOUT).await {
                Ok((status, _)) if status.is_success() => Ok(()),
                // The front end's 502 says which back end failed: worth passing on.
                Ok((status, body)) => Err(format!("{status}: {}", first_line(&body))),
                Err(e) => Err(e),
            }
        }
    };
    Ok(drive(args.rps, args.concurrency, send, shutdown).await)
}

/// Outcomes of requests in flight, taken out by each report.
#[derive(Debug, Default)]
struct Outcomes {
    ok: AtomicU64,
    failed: AtomicU64,
    /// Why the last failed request failed.
    last_error: Mutex<Option<String>>,
}

/// Calls `send` `rps` times a second, at most `concurrency` calls at once, until
/// `shutdown`; `send` says `Ok` or why it failed.
async fn drive<S, F>(
    rps: u32,
    concurrency: u32,
    send: S,
    shutdown: impl Future<Output = ()>,
) -> Counts
where
    S: Fn() -> F,
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(concurrency.max(1) as usize));
    let outcomes = Arc::new(Outcomes::default());
    // Dropped at shutdown, which ends the requests still in flight.
    let mut in_flight = JoinSet::new();
    let mut tick = interval(Duration::from_secs(1) / rps.max(1));
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut report = interval_at(Instant::now() + REPORT_EVERY, REPORT_EVERY);
    let (mut window, mut total) = (Counts::default(), Counts::default());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = report.tick() => {
                let window = take(&mut window, &outcomes, &mut total);
                let last_error = lock(&outcomes.last_error).take();
                match last_error {
                    Some(e) => eprintln!("load: last {REPORT_EVERY:?}: {window}; last failure: {e}"),
                    None => eprintln!("load: last {REPORT_EVERY:?}: {window}"),
                }
            }
            _ = tick.tick() => {
                while in_flight.try_join_next().is_some() {}
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    window.skipped += 1;
                    continue;
                };
                window.sent += 1;
                let (request, outcomes) = (send(), outcomes.clone());
                in_flight.spawn(async move {
                    match request.await {
                        Ok(()) => outcomes.ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            *lock(&outcomes.last_error) = Some(e);
                            outcomes.failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                    drop(permit);
                });
            }
        }
    }
    take(&mut window, &outcomes, &mut total);
    total
}

/// The counts since the last call (adding them to `total`), and starts a new window.
fn take(window: &mut Counts, outcomes: &Outcomes, total: &mut Counts) -> Counts {
    let mut taken = std::mem::take(window);
    taken.ok = outcomes.ok.swap(0, Ordering::Relaxed);
    taken.failed = outcomes.failed.swap(0, Ordering::Relaxed);
    total.sent += taken.sent;
    total.ok += taken.ok;
    total.failed += taken.failed;
    total.skipped += taken.skipped;
    taken
}

/// The first line of a body, cut short: enough to say why a request failed.
fn first_line(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(160)
        .collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::super::{respond, serve_http};
    use super::*;
    use hyper::StatusCode;
    use std::sync::atomic::AtomicUsize;
    use tokio::net::TcpListener;

    /// With time paused, ticks come exactly on time: 10 are due in 950 ms at 10/s.
    #[tokio::test(start_paused = true)]
    async fn a_tick_with_every_request_busy_is_skipped_not_queued() {
        let never_answered = || std::future::pending::<Result<(), String>>();
        let shutdown = tokio::time::sleep(Duration::from_millis(950));
        let counts = drive(10, 4, never_answered, shutdown).await;
        let expected = Counts {
            sent: 4,
            ok: 0,
            failed: 0,
            skipped: 6,
        };
        assert_eq!(counts, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_counted_as_ok_or_failed() {
        let calls = Arc::new(AtomicU64::new(0));
        let every_other_fails = move || {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            async move {
                if n.is_multiple_of(2) {
                    Ok(())
                } else {
                    Err("503".to_owned())
                }
            }
        };
        let shutdown = tokio::time::sleep(Duration::from_millis(950));
        let counts = drive(10, 4, every_other_fails, shutdown).await;
        let expected = Counts {
            sent: 10,
            ok: 5,
            failed: 5,
            skipped: 0,
        };
        assert_eq!(counts, expected);
    }

    /// What the slow test server saw.
    #[derive(Debug, Default)]
    struct Seen {
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
        requests: AtomicUsize,
    }

    #[tokio::test]
    async fn never_more_than_concurrency_requests_reach_a_slow_server_at_once() {
        const CONCURRENCY: usize = 3;
        let seen = Arc::new(Seen::default());
        // Requests are held until CONCURRENCY of them are in flight together, so the test
        // proves the limit is reached, and only then exceeded if it does not hold.
        let (full, _) = tokio::sync::watch::channel(false);
        let full = Arc::new(full);
        let handler = {
            let seen = seen.clone();
            move |_request| {
                let (seen, full) = (seen.clone(), full.clone());
                async move {
                    seen.requests.fetch_add(1, Ordering::SeqCst);
                    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
                    if now >= CONCURRENCY {
                        full.send_replace(true);
                    }
                    let _ = full.subscribe().wait_for(|&full| full).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    seen.in_flight.fetch_sub(1, Ordering::SeqCst);
                    respond(StatusCode::OK, "text/plain", "slow\n".into())
                }
            }
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_http(listener, handler, std::future::pending()));

        let args = LoadArgs {
            target: format!("http://{addr}/").parse().unwrap(),
            rps: 200,
            concurrency: CONCURRENCY as u32,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let load = tokio::spawn(run(args, async {
            let _ = stopped.await;
        }));
        let enough = async {
            while seen.requests.load(Ordering::SeqCst) < 4 * CONCURRENCY {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), enough)
            .await
            .unwrap();
        let _ = stop.send(());
        let counts = load.await.unwrap().unwrap();

        assert_eq!(seen.most_in_flight.load(Ordering::SeqCst), CONCURRENCY);
        assert!(counts.sent >= 4 * CONCURRENCY as u64, "{counts}");
        assert!(counts.ok >= 1, "{counts}");
        assert_eq!(counts.failed, 0, "{counts}");
    }
}
