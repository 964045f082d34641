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

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event, with its spans (`conn{pod=… peer=…}`).
    #[default]
    Plain,
    /// One JSON object per line, with the current span's fields and the span list — for
    /// log pipelines.
    Json,
}

/// A subscriber that logs to stderr with `filter` in `format`, and the handle that changes
/// the filter.
pub fn subscriber(
    filter: &str,
    format: LogFormat,
) -> Result<(impl tracing::Subscriber + Send + Sync, Arc<dyn LogLevel>), String> {
    // Colours only on a terminal: a pod's log is a file, where escape codes are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    subscriber_to(filter, format, ansi, std::io::stderr)
}

/// As [`subscriber`], writing to `writer` (with colours if `ansi`).
pub fn subscriber_to<W>(
    filter: &str,
    format: LogFormat,
    ansi: bool,
    writer: W,
) -> Result<(impl tracing::Subscriber + Send + Sync, Arc<dyn LogLevel>), String>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Clone + Send + Sync + 'static,
{
    let env =
        EnvFilter::try_new(filter).map_err(|e| format!("invalid log filter {filter:?}: {e}"))?;
    let (layer, handle) = reload::Layer::new(env);
    let plain = (format == LogFormat::Plain).then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer.clone())
    });
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(writer)
    });
    let subscriber = Registry::default().with(layer).with(plain).with(json);
    let level = Arc::new(Reloadable {
        handle,
        current: Mutex::new(filter.to_string()),
    });
    Ok((subscriber, level))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Buffer {
            self.clone()
        }
    }

    fn logged(format: LogFormat) -> String {
        let buf = Buffer::default();
        let (subscriber, _) =
            subscriber_to("info", format, false, buf.clone()).unwrap_or_else(|e| panic!("{e}"));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "conn",
                pod = "shop/web-0",
                listener = "outbound",
                peer = "10.1.0.5:41234",
                dst = tracing::field::Empty,
            );
            let _in = span.enter();
            span.record("dst", "10.96.0.10:80");
            tracing::info!(error = "upstream: refused", "connection failed");
        });
        let bytes = buf.0.lock().unwrap_or_else(PoisonError::into_inner).clone();
        String::from_utf8(bytes).unwrap_or_default()
    }

    #[test]
    fn every_line_of_a_connection_says_whose_it_was_in_either_format() {
        let plain = logged(LogFormat::Plain);
        assert!(
            plain.contains("conn{pod=\"shop/web-0\" listener=\"outbound\" peer=\"10.1.0.5:41234\" dst=\"10.96.0.10:80\"}"),
            "{plain}"
        );
        let json: serde_json::Value =
            serde_json::from_str(logged(LogFormat::Json).trim()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(json["fields"]["message"], "connection failed", "{json}");
        assert_eq!(json["span"]["name"], "conn", "{json}");
        assert_eq!(json["span"]["pod"], "shop/web-0", "{json}");
        assert_eq!(json["span"]["dst"], "10.96.0.10:80", "{json}");
    }
}
