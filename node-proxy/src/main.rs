//! `ambit-proxy`: parse the configuration, start the node proxy, stop on SIGTERM.

use ambit_proxy::config::Config;
use anyhow::Context;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    bounded_heap();
    let config = Config::parse();
    // One thread by default, as Linkerd's proxy: on a shared node the proxy's cost per
    // request is mostly cross-thread wake-ups when it has more (BENCHMARKS.md).
    let runtime = match config.worker_threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
    .context("starting the runtime")?;
    runtime.block_on(run(config))
}

async fn run(config: Config) -> anyhow::Result<()> {
    let (subscriber, log_level) = ambit_proxy::logging::subscriber(&config.log, config.log_format)
        .map_err(anyhow::Error::msg)?;
    tracing::subscriber::set_global_default(subscriber).context("installing the logger")?;
    tokio::spawn(return_free_heap());
    // A proxy running with the same run directory hands its listeners over (hitless
    // restart). Its admin listener too when the address is taken — by that proxy, in the
    // same network namespace; in a pod of its own, this one binds its own.
    let bound = bind_admin(&config).await;
    let want_admin = bound.is_err();
    let (predecessor, admin) = match ambit_proxy::handover::Predecessor::connect(
        &config.run_dir,
        want_admin,
    )
    .await
    {
        Ok(Some((predecessor, Some(admin)))) => (Some(predecessor), admin),
        Ok(Some((predecessor, None))) => (Some(predecessor), bound?),
        Ok(None) => (None, bound?),
        Err(error) => {
            tracing::warn!(%error, "cannot take over from the proxy running with this run directory; starting anew");
            (None, bound?)
        }
    };
    // Handed over to a new process, this returns only once told to stop (see app).
    ambit_proxy::app::run_taking_over(config, admin, predecessor, log_level, shutdown_signal())
        .await?;
    Ok(())
}

async fn bind_admin(config: &Config) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(config.admin_addr)
        .await
        .with_context(|| format!("binding the admin server to {}", config.admin_addr))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// How often the proxy hands the heap's free pages back to the system.
const RETURN_FREE_HEAP: std::time::Duration = std::time::Duration::from_secs(10);

/// Gives the heap's free pages back to the system now and then (`malloc_trim(0)`, as
/// tcmalloc's background release does): the buffers of a finished stream are freed into
/// the middle of the heap, which glibc only trims at its top. Trimmed by hand after an
/// iperf3 stream, the resident heap went from ~2.0 MB to ~0.8 MB (BENCHMARKS.md, memory).
async fn return_free_heap() {
    let mut every = tokio::time::interval(RETURN_FREE_HEAP);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        every.tick().await;
        ambit_ebpf::sys::release_free_memory();
    }
}

/// Keeps glibc from holding on to freed buffers. By default it raises its mmap threshold
/// after the first large buffer is freed (up to 32 MiB), after which relay buffers and
/// HTTP/2 flow-control buffers come from the heap and stay resident once freed. A fixed
/// threshold sends every allocation of 128 KiB or more to mmap (returned on free)
/// (BENCHMARKS.md, memory). The heap's top is not trimmed on every free: with a trim
/// threshold of 128 KiB, a bulk stream's records (a 16 KiB buffer each, freed as written)
/// moved the top up and down 15,000 times per GB, each time faulting fresh zeroed pages
/// back in (~5 % of the proxies' CPU; BENCHMARKS.md, "Bulk throughput against the crypto
/// floor"). [`return_free_heap`] gives free pages back every 10 s instead.
fn bounded_heap() {
    const MMAP_THRESHOLD: libc::c_int = 128 * 1024;
    const TRIM_THRESHOLD: libc::c_int = 8 * 1024 * 1024;
    // SAFETY: mallopt only changes allocator parameters; called before any other thread
    // exists.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}
