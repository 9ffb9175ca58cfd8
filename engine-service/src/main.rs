use clap::Parser;
use engine_service::config::{EngineArgs, EngineConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let (args, random) = split_random_weight_flags(std::env::args().collect())?;
    let mut args = EngineArgs::parse_from(args);
    if args.kernel_sets {
        println!("{}", engine_cpu::kernels::kernel_sets().join(" "));
        return Ok(());
    }
    if let Some((config_json, spec)) = random {
        // The model "file" is the config; the backend generates the weights (see docs/qwen36.md).
        args.model = Some(config_json);
        engine_service::backend::cpu::set_random_spec(spec);
    }
    let config = EngineConfig::from_args(args)?;
    if let Some(addr) = &config.metrics_listen {
        let addr: std::net::SocketAddr = addr.parse()?;
        metrics_exporter_prometheus::PrometheusBuilder::new().with_http_listener(addr).install()?;
    }
    engine_service::server::run(config, shutdown_signal()).await?;
    Ok(())
}

/// A config.json to run with random weights, and how to draw them.
type RandomWeights = (std::path::PathBuf, engine_service::backend::cpu::RandomSpec);

/// Takes the random-weight flags out of argv (the rest goes to clap):
/// `--random-weights-config PATH` (a Qwen3.5/3.6 config.json; runs that architecture with
/// seeded random weights and a byte-level tokenizer), `--random-seed N` (default 0),
/// `--random-dtype bf16|f32|nvfp4|q4_k_m` (default bf16; q4_k_m: Q4_K Linears with a Q6_K
/// embedding and head, llama.cpp's Q4_K_M mix).
fn split_random_weight_flags(argv: Vec<String>) -> anyhow::Result<(Vec<String>, Option<RandomWeights>)> {
    use engine_cpu::kernels::GgmlType;
    let mut rest = Vec::with_capacity(argv.len());
    let mut config = None;
    let mut spec = engine_service::backend::cpu::RandomSpec::default();
    let mut it = argv.into_iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--random-") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        if !matches!(flag.as_str(), "--random-weights-config" | "--random-seed" | "--random-dtype") {
            rest.push(a);
            continue;
        }
        let value = match inline.or_else(|| it.next()) {
            Some(v) => v,
            None => anyhow::bail!("{flag} needs a value"),
        };
        match flag.as_str() {
            "--random-weights-config" => config = Some(std::path::PathBuf::from(value)),
            "--random-seed" => {
                spec.seed = value.parse().map_err(|e| anyhow::anyhow!("--random-seed {value:?}: {e}"))?
            }
            _ => {
                (spec.dtype, spec.nvfp4) = match value.as_str() {
                    "bf16" => (GgmlType::BF16, false),
                    "f32" => (GgmlType::F32, false),
                    "nvfp4" => (GgmlType::BF16, true),
                    "q4_k_m" => (GgmlType::Q4_K, false),
                    other => anyhow::bail!("--random-dtype {other:?}: expected bf16, f32, nvfp4 or q4_k_m"),
                }
            }
        }
    }
    if config.is_none() && spec != engine_service::backend::cpu::RandomSpec::default() {
        anyhow::bail!("--random-seed/--random-dtype need --random-weights-config");
    }
    Ok((rest, config.map(|c| (c, spec))))
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
