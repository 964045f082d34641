//! The demo and its terminal: the signals that end a foreground `ambit demo` (SIGINT from
//! Ctrl-C, SIGTERM, SIGHUP from a closed terminal — all the same way: remove the demo),
//! and writes that never fail, because the terminal's other end may be gone.
//!
//! `sudo ./scripts/demo.sh | tee demo.log` and Ctrl-C: the terminal sends SIGINT to `tee`
//! as well, so stdout (and, with `2>&1`, stderr) is a pipe without a reader by the time the
//! demo is removed. Rust's `print!` panics on that broken pipe, which would end the process
//! before `down` ran; everything the demo says goes through [`out`] and [`err`] instead,
//! which drop what cannot be written.

use std::io::Write;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// The signal that asked the demo to end (0: none yet).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Catches SIGINT, SIGTERM and SIGHUP for the rest of the process: from now on they no
/// longer kill it, they are recorded for [`received`]. The returned runtime runs the
/// handlers' task: keep it alive as long as the demo runs.
pub fn catch_signals() -> anyhow::Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ambit-demo-signals")
        .enable_all()
        .build()?;
    let streams = rt.block_on(async {
        [
            SignalKind::interrupt(),
            SignalKind::terminate(),
            SignalKind::hangup(),
        ]
        .into_iter()
        .map(|kind| signal(kind).map(|s| (kind, s)))
        .collect::<std::io::Result<Vec<_>>>()
    })?;
    for (kind, mut stream) in streams {
        rt.spawn(async move {
            while stream.recv().await.is_some() {
                // The first one counts; a second Ctrl-C while the demo is being removed
                // changes nothing (the removal finishes).
                let _ = RECEIVED.compare_exchange(
                    0,
                    kind.as_raw_value(),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        });
    }
    Ok(rt)
}

/// The name of the signal that asked the demo to end, if one did.
pub fn received() -> Option<&'static str> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        n if n == libc::SIGINT => Some("SIGINT"),
        n if n == libc::SIGTERM => Some("SIGTERM"),
        n if n == libc::SIGHUP => Some("SIGHUP"),
        _ => Some("a signal"),
    }
}

/// 128 + the signal that ended the demo, as a shell reports a process a signal ended.
pub fn exit_status() -> i32 {
    128 + RECEIVED.load(Ordering::SeqCst)
}

/// An error when a signal asked the demo to end: the steps of `up` call it between waits,
/// so that Ctrl-C during `up` stops it within a fraction of a second.
pub fn check() -> anyhow::Result<()> {
    match received() {
        Some(sig) => anyhow::bail!("{sig} received: the demo was not started to the end"),
        None => Ok(()),
    }
}

/// Waits until a signal asks the demo to end.
pub async fn ended() {
    while received().is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes `text` to stdout; a closed stdout is not an error.
pub fn out(text: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
}

/// Writes `text` to stderr; a closed stderr is not an error.
pub fn err(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}
