//! Shared vocabulary of Ambit's node proxy and control plane.
//!
//! # Layout
//!
//! - [`cni`]: the messages between the CNI plugin and the node proxy.
//! - [`identity`]: workload identities, their SPIFFE IDs and DNS names.
//! - [`duration`]: durations as written in configuration (`24h`, `500ms`) and in Gateway
//!   API objects (`1h30m`).
//! - [`ports`]: port sets as written in annotations (`25,3306,4000-4100`).
//! - [`proto`]: gRPC bindings generated from `proto/` at build time.
//!
//! The node proxy and the control plane never import each other; this crate is all they
//! share.

pub mod cni;
pub mod duration;
pub mod identity;
pub mod policy;
pub mod ports;

/// gRPC bindings generated from the `.proto` files in `api/proto`.
pub mod proto {
    /// The discovery service, `ambit.discovery.v1`.
    pub mod discovery {
        #![allow(missing_docs, clippy::all, missing_debug_implementations)]
        tonic::include_proto!("ambit.discovery.v1");
    }

    /// The identity (certificate authority) service, `ambit.identity.v1`.
    pub mod identity {
        #![allow(missing_docs, clippy::all, missing_debug_implementations)]
        tonic::include_proto!("ambit.identity.v1");
    }

    /// The inbound policy service, `ambit.policy.v1`.
    pub mod policy {
        #![allow(missing_docs, clippy::all, missing_debug_implementations)]
        tonic::include_proto!("ambit.policy.v1");
    }
}

pub use identity::{
    IdentityError, WorkloadIdentity, CONTROL_PLANE_NAMESPACE, CONTROL_PLANE_SERVICE_ACCOUNT,
    DEFAULT_TRUST_DOMAIN,
};
