//! Inbound policy: what may reach each port of each meshed pod on the node.
//!
//! The control plane renders Servers, AuthorizationPolicies, their authentications, the
//! default inbound policy and the pods' probes into one shape per pod and port
//! (`ambit.policy.v1`); [`PolicyClient`] streams it into a [`PolicyState`]; the data path
//! asks the state for a port's [`PortPolicy`] and checks a [`Client`] against it — per
//! connection on the plaintext listener (4144, by address), per CONNECT stream or request
//! on the mesh listener (4143, by identity and address).

mod client;
pub mod dump;
mod model;
pub mod routes;
mod state;

pub use client::{PolicyClient, PolicyMetrics};
pub use model::{
    parse_networks, Authorization, Cidr, Client, IdentityPattern, MeshTls, Network, PodPolicy,
    PortPolicy, Verdict,
};
pub use state::PolicyState;

#[cfg(test)]
mod tests;
