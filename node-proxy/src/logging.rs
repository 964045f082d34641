//! Logging with a filter that can be changed at run time (`PUT /log-level`).

use std::sync::{Arc, Mutex, PoisonError};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// Reads and changes the log filter.
pub trait LogLevel: Send + Sync + 'static {
    /// The current filter.
    fn get(&self) -> String;
    /// Replaces the filter; the error says why `filter` is not valid.
    fn set(&self, filter: &str) -> Result<(), String>;
}

struct Reloadable {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

impl LogLevel for Reloadable {
    fn get(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, filter: &str) -> Result<(), String> {
        let new = EnvFilter::try_new(filter)
            .map_err(|e| format!("invalid log filter {filter:?}: {e}"))?;
        self.handle
            .reload(new)
            .map_err(|e| format!("cannot change the log filter: {e}"))?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = filter.to_string();
        Ok(())
    }
}

/// A subscriber that logs to stderr with `filter`, and the handle that changes it.
pub fn subscriber(
    filter: &str,
) -> Result<(impl tracing::Subscriber + Send + Sync, Arc<dyn LogLevel>), String> {
    let env =
        EnvFilter::try_new(filter).map_err(|e| format!("invalid log filter {filter:?}: {e}"))?;
    let (layer, handle) = reload::Layer::new(env);
    let subscriber = Registry::default()
        .with(layer)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr));
    let level = Arc::new(Reloadable {
        handle,
        current: Mutex::new(filter.to_string()),
    });
    Ok((subscriber, level))
}
