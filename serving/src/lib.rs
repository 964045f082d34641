//! What the node proxy's and the control plane's servers share to stay bounded (issue 10):
//!
//! - [`stall`]: a write to a peer that stopped reading fails after a deadline, so that a
//!   client which never reads what it asked for cannot hold a connection, its buffers and
//!   its place in a budget forever.

pub mod stall;

pub use stall::WriteDeadline;
