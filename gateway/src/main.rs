//! The gateway binary: parse flags, set up logging, serve until SIGINT/SIGTERM.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let config = gateway::Config::from_cli(gateway::Cli::parse())?;
    gateway::run(config).await?;
    Ok(())
}
