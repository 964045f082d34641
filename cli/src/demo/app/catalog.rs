//! `ambit demo app catalog`: the gRPC back end, `demo.Catalog/Lookup`. A replica can be
//! made to fail a share of its calls (`--fail-percent`) and to answer late (`--delay`),
//! so that the demo shows the mesh's success rate and latency per replica.

use ambit_api::duration::parse_duration;
use proto::catalog_server::{Catalog, CatalogServer};
use proto::{LookupReply, LookupRequest};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

/// gRPC bindings generated from `proto/demo.proto`.
pub mod proto {
    #![allow(missing_docs, clippy::all, missing_debug_implementations)]
    tonic::include_proto!("demo");
}

/// Flags of `ambit demo app catalog`.
#[derive(Debug, Clone, clap::Args)]
pub struct CatalogArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub listen: SocketAddr,
    /// Percentage of calls to fail with INTERNAL, spread evenly: any 100 consecutive
    /// calls have exactly this many failures.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub fail_percent: u32,
    /// How long to wait before answering (or failing) each call, e.g. 30ms.
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    pub delay: Duration,
    /// The name this replica answers with (`served_by`).
    #[arg(long, default_value = "catalog")]
    pub name: String,
}

/// Serves `demo.Catalog` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    args: CatalogArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(CatalogServer::new(Replica::new(args)))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// One catalog replica.
#[derive(Debug)]
struct Replica {
    args: CatalogArgs,
    /// Calls received so far; decides which ones fail.
    calls: AtomicU64,
}

impl Replica {
    fn new(args: CatalogArgs) -> Self {
        Self {
            args,
            calls: AtomicU64::new(0),
        }
    }
}

/// Whether call number `n` (from 0) fails when `percent` of calls should: exactly when
/// `n * percent / 100` steps up, so that any 100 consecutive calls have exactly `percent`
/// failures, spread evenly rather than in a burst.
fn fails(n: u64, percent: u32) -> bool {
    let percent = u64::from(percent.min(100));
    (n + 1) * percent / 100 > n * percent / 100
}

/// How many of `item` are in stock: made up, but the same for the same item.
fn stock(item: &str) -> u32 {
    item.bytes().map(u32::from).sum::<u32>() % 50
}

#[tonic::async_trait]
impl Catalog for Replica {
    async fn lookup(
        &self,
        request: Request<LookupRequest>,
    ) -> Result<Response<LookupReply>, Status> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        if !self.args.delay.is_zero() {
            tokio::time::sleep(self.args.delay).await;
        }
        if fails(n, self.args.fail_percent) {
            return Err(Status::internal(format!(
                "injected failure (--fail-percent {})",
                self.args.fail_percent
            )));
        }
        let item = request.into_inner().item;
        Ok(Response::new(LookupReply {
            stock: stock(&item),
            item,
            served_by: self.args.name.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::catalog_client::CatalogClient;

    fn args(fail_percent: u32, delay: Duration) -> CatalogArgs {
        CatalogArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            fail_percent,
            delay,
            name: "catalog-test".into(),
        }
    }

    #[test]
    fn any_100_consecutive_calls_have_exactly_percent_failures() {
        for percent in 0..=100 {
            let failed: Vec<bool> = (0..300).map(|n| fails(n, percent)).collect();
            for window in failed.windows(100) {
                let count = window.iter().filter(|&&f| f).count();
                assert_eq!(count, percent as usize, "--fail-percent {percent}");
            }
        }
    }

    #[tokio::test]
    async fn a_served_replica_fails_exactly_n_of_100_calls_and_answers_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(
            listener,
            args(7, Duration::from_millis(1)),
            std::future::pending(),
        ));
        let mut client = CatalogClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (mut failed, mut answered) = (0, 0);
        for _ in 0..100 {
            let call = client
                .lookup(LookupRequest {
                    item: "widget".into(),
                })
                .await;
            match call {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    assert_eq!(reply.item, "widget");
                    assert_eq!(reply.served_by, "catalog-test");
                    answered += 1;
                }
                Err(status) => {
                    assert_eq!(status.code(), tonic::Code::Internal);
                    assert_eq!(status.message(), "injected failure (--fail-percent 7)");
                    failed += 1;
                }
            }
        }
        assert_eq!((failed, answered), (7, 93));
    }

    /// With time paused, a sleep moves the clock by exactly its length: this proves the
    /// delay is slept (on failed calls too) without measuring real time.
    #[tokio::test(start_paused = true)]
    async fn every_call_waits_the_delay_first() {
        let delay = Duration::from_millis(30);
        let replica = Replica::new(args(50, delay));
        let mut failed = 0;
        for _ in 0..4 {
            let start = tokio::time::Instant::now();
            let call = replica.lookup(Request::new(LookupRequest {
                item: "gizmo".into(),
            }));
            failed += usize::from(call.await.is_err());
            assert!(start.elapsed() >= delay);
        }
        assert_eq!(failed, 2);
    }
}
