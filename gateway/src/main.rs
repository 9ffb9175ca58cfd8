//! The gateway binary: parse flags, set up logging, serve until SIGINT/SIGTERM.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        // No colour codes in journald or a log file.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match serve().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("gateway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> anyhow::Result<()> {
    let config = gateway::Config::from_cli(gateway::Cli::parse())?;
    gateway::run(config).await?;
    Ok(())
}
