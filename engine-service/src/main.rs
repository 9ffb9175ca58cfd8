use std::io::IsTerminal;

use clap::Parser;
use engine_service::config::{EngineArgs, EngineConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        // No colour codes in journald or a log file.
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    let args = EngineArgs::parse();
    if args.kernel_sets {
        println!("{}", engine_cpu::kernels::kernel_sets().join(" "));
        return Ok(());
    }
    let config = EngineConfig::from_args(args)?;
    if let Some(addr) = &config.metrics_listen {
        let addr: std::net::SocketAddr = addr.parse()?;
        engine_service::metrics::install_recorder()?;
        engine_service::metrics::serve_exporter(addr, config.takeover).await?;
    }
    engine_service::server::run(config, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}
