//! Opening a discovery watch as a node proxy does, for tests that read the stream itself.

use ambit_api::proto::discovery::WatchRequest;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// A watch of `node`'s discovery, authenticated with `token_of`'s node token (none when
/// `None`), first subscribing to `subscribe`. Later requests go on the returned sender;
/// dropping it ends the requests (the stream stays open).
pub fn watch_request(
    node: &str,
    token_of: Option<&str>,
    subscribe: &[&str],
) -> (
    tonic::Request<ReceiverStream<WatchRequest>>,
    mpsc::Sender<WatchRequest>,
) {
    let (tx, rx) = mpsc::channel(16);
    tx.try_send(WatchRequest {
        node: node.into(),
        subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
        by_need: true,
        ..WatchRequest::default()
    })
    .unwrap();
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token_of) = token_of {
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", crate::node_token(token_of))
                .parse()
                .unwrap(),
        );
    }
    (req, tx)
}
