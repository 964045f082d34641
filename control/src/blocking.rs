//! Work too heavy for the async workers. Loading a large cluster, diffing it against the
//! last one and rendering the change take seconds at 100,000 pods; on the runtime's
//! workers (as many as cores) they would hold up every gRPC call and `/ready` meanwhile.

/// Runs `f` on a blocking thread and returns what it returns; a panic in `f` goes on in
/// the caller.
pub async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(out) => out,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only when the runtime shuts down, which ends the caller too.
            Err(e) => panic!("blocking work cancelled: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::run;

    #[tokio::test(flavor = "current_thread")]
    async fn the_work_runs_off_the_worker_and_its_panic_reaches_the_caller() {
        let worker = std::thread::current().id();
        let there = run(|| std::thread::current().id()).await;
        assert_ne!(there, worker, "on a blocking thread");
        let panicked = tokio::spawn(run(|| -> u8 { panic!("boom") }))
            .await
            .unwrap_err();
        let message = panicked.into_panic();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"boom"));
    }
}
