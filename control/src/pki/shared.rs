//! The CA in use, replaced as a whole when its files change: the identity service signs
//! with whatever is current at each request, and the control plane's own serving
//! certificate is re-issued from a new issuer at once.

use super::CertificateAuthority;
use std::sync::Arc;
use tokio::sync::watch;

/// A handle on the CA in use; clones share it.
#[derive(Clone, Debug)]
pub struct SharedCa {
    current: Arc<watch::Sender<Arc<CertificateAuthority>>>,
}

impl SharedCa {
    /// Starts with `ca`.
    pub fn new(ca: CertificateAuthority) -> Self {
        Self {
            current: Arc::new(watch::channel(Arc::new(ca)).0),
        }
    }

    /// The CA in use now.
    pub fn current(&self) -> Arc<CertificateAuthority> {
        self.current.borrow().clone()
    }

    /// Sees every replacement.
    pub fn subscribe(&self) -> watch::Receiver<Arc<CertificateAuthority>> {
        self.current.subscribe()
    }

    /// Replaces the CA for every holder of this handle.
    pub fn replace(&self, ca: CertificateAuthority) {
        self.current.send_replace(Arc::new(ca));
    }
}
