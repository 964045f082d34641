//! Ambit node proxy: one proxy per node serving every meshed pod on it.
//!
//! # Layout
//!
//! - [`discovery`]: the cluster as the control plane streams it; resolution of outbound
//!   destinations (Service ClusterIP → endpoints, pod IP → pod).
//! - [`identity`]: one key and certificate per workload identity on the node, obtained
//!   from the control plane's CA and renewed before expiry.
//! - [`tls`]: the trust bundle and the rustls verifiers that check a peer's chain and its
//!   SPIFFE ID.
//!
//! - [`cni`]: the CNI plugin's socket, and the pods it handed over (kept across restarts).
//! - [`enrol`]: pods meshed while running, found in `/proc` and kept as CNI's are.
//! - [`token`]: the node token, re-read when the kubelet rotates it.
//! - [`config`]: flags and environment variables, validated up front.
//! - [`control`]: TLS channels to the control plane.
//! - [`app`]: wiring — discovery drives the identity manager; the admin server.
//! - [`admin`]: `/metrics`, `/ready`, `/live`, and the loopback-only admin views
//!   (`/config_dump`, `/log-level`, `/shutdown`).
//! - [`logging`]: a log filter changeable at run time.
//! - [`limits`]: connection budgets per pod and per node, out of the descriptor limit.
//! - [`build_info`]: `proxy_build_info`, the build's version in the metrics.
//! - [`process_metrics`]: `process_*` (CPU, memory, descriptors, threads) from `/proc`.
//! - [`pods`]: the pod lifecycle — which local pods are served, and how each one ends
//!   (redirection removed, or kept and failing closed).
//! - [`policy`]: the inbound policy the control plane streams, and matching a client
//!   against it.
//! - [`stream`]: what the streams from the control plane share (reconnection, chunks).
//! - [`proxy`]: the data path — the in-pod listeners, the mesh tunnel, L7.
//! - [`netns`]: sockets inside a pod's network namespace.
//! - [`handover`]: hitless restart — a new process takes the listeners over from the
//!   running one, which drains.
//! - [`persist`]: the state kept on disk (discovery, policy, keys and certificates) so
//!   that a restart while the control plane is away serves from it.

pub mod admin;
pub mod app;
pub mod build_info;
pub mod cni;
pub mod config;
pub mod config_dump;
pub mod control;
pub mod discovery;
pub mod enrol;
pub mod handover;
pub mod identity;
pub mod ktls;
pub mod limits;
pub mod logging;
pub mod netns;
pub mod persist;
pub mod pods;
pub mod policy;
pub mod process_metrics;
pub mod proxy;
pub mod readiness;
pub mod stream;
pub mod tls;
pub mod token;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
