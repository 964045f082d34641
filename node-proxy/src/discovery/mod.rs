//! Discovery: what the proxy knows of the cluster, streamed from the control plane — the
//! pods of its node, and the destinations its pods use, subscribed on demand.
//!
//! [`DiscoveryClient::run`] keeps one `Watch` stream open, sends it the destinations
//! [`Subscriptions`] holds (and what changes), applies each update to a
//! [`DiscoveryState`] and publishes it on a `watch` channel. While the control plane is
//! away the last state stays in use; a reconnect sends the subscriptions again and brings
//! a fresh snapshot of them.

mod client;
mod state;
mod subscriptions;

pub use client::{DiscoveryClient, DiscoveryMetrics};
pub use state::{
    Destination, DiscoveryState, Endpoint, InvalidResource, Lookup, PodRef, Resolution, Service,
    ServicePort, Workload,
};
pub use subscriptions::{
    sweep, SubscriptionMetrics, Subscriptions, Target, WaitError, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_LOOKUP_TIMEOUT, MAX_SUBSCRIPTIONS,
};

impl crate::stream::Chunked for ambit_api::proto::discovery::Update {
    fn is_snapshot(&self) -> bool {
        self.snapshot
    }

    fn more(&self) -> bool {
        self.more
    }

    fn append(&mut self, mut later: Self) {
        self.workloads.append(&mut later.workloads);
        self.services.append(&mut later.services);
        self.removed_workloads.append(&mut later.removed_workloads);
        self.removed_services.append(&mut later.removed_services);
        self.endpoint_deltas.append(&mut later.endpoint_deltas);
        self.resolutions.append(&mut later.resolutions);
        self.removed_resolutions
            .append(&mut later.removed_resolutions);
        self.more = later.more;
    }
}
