//! What the node proxy's and the control plane's servers share to stay bounded (issue 10):
//!
//! - [`stall`]: a write to a peer that stopped reading fails after a deadline, so that a
//!   client which never reads what it asked for cannot hold a connection, its buffers and
//!   its place in a budget forever.
//! - [`files`]: files replaced while the process runs (trust anchors, the issuer), polled
//!   by content, so that a new bundle or issuer is taken without a restart.

pub mod files;
pub mod stall;

pub use files::FilePoller;
pub use stall::WriteDeadline;
