//! Discovery: the proxy's view of the cluster, streamed from the control plane.
//!
//! [`DiscoveryClient::run`] keeps one `Watch` stream open, applies each update to a
//! [`DiscoveryState`] and publishes it on a `watch` channel. While the control plane is
//! away the last state stays in use; a reconnect brings a fresh snapshot.

mod chunks;
mod client;
mod state;

pub use client::{DiscoveryClient, DiscoveryMetrics};
pub use state::{
    Destination, DiscoveryState, Endpoint, InvalidResource, Service, ServicePort, Workload,
};
