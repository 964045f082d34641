//! Discovery: the proxy's view of the cluster, streamed from the control plane.
//!
//! [`DiscoveryClient::run`] keeps one `Watch` stream open, applies each update to a
//! [`DiscoveryState`] and publishes it on a `watch` channel. While the control plane is
//! away the last state stays in use; a reconnect brings a fresh snapshot.

mod client;
mod state;

pub use client::{DiscoveryClient, DiscoveryMetrics};
pub use state::{
    Destination, DiscoveryState, Endpoint, InvalidResource, Service, ServicePort, Workload,
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
        self.more = later.more;
    }
}
