//! `ambit-control`: parse the configuration, start the control plane, stop on SIGTERM.

use ambit_control::config::Config;
use ambit_control::{Control, Listeners};
use anyhow::Context;
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log).context("--log")?;
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a pod's log is a file, where escape codes are noise.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter);
    match config.log_format {
        ambit_control::config::LogFormat::Plain => logs.init(),
        ambit_control::config::LogFormat::Json => logs.json().with_current_span(true).init(),
    }
    let listeners = Listeners {
        identity: tokio::net::TcpListener::bind(config.identity_addr)
            .await
            .with_context(|| format!("binding the identity service to {}", config.identity_addr))?,
        discovery: tokio::net::TcpListener::bind(config.discovery_addr)
            .await
            .with_context(|| {
                format!("binding the discovery service to {}", config.discovery_addr)
            })?,
        policy: tokio::net::TcpListener::bind(config.policy_addr)
            .await
            .with_context(|| format!("binding the policy service to {}", config.policy_addr))?,
        admin: tokio::net::TcpListener::bind(config.admin_addr)
            .await
            .with_context(|| format!("binding the admin server to {}", config.admin_addr))?,
    };
    let control = Control::build(config).await?;
    control.serve(listeners, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
