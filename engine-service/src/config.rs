//! Engine runtime config: flags, optionally a TOML file (`--config`), flags win.

use std::path::PathBuf;
use std::str::FromStr;

use clap::{Parser, ValueEnum};
use engine_cpu::kernels::GgmlType;
use serde::{Deserialize, Deserializer};

use crate::backend::cpu::RandomSpec;
use crate::backend::device::DeviceSetting;
use crate::memory::KvDtype;
use crate::speculative::{DrafterKind, SpecConfig, TreeShape};

#[derive(Parser, Debug, Clone, Default)]
#[command(name = "engine-service", about = "Loads a model and serves Generate/Abort/Info over gRPC")]
pub struct EngineArgs {
    /// Print the CPU kernel sets this machine can run, best first (the values
    /// `EDGE_KERNELS_ISA` accepts here), and exit.
    #[arg(long)]
    pub kernel_sets: bool,
    /// TOML config file (deploy/edge.toml); its `[engine]` table sets defaults for the flags.
    #[arg(long, env = "ENGINE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Model: a GGUF file, or an HF checkpoint directory (config.json + safetensors; the
    /// Qwen3.5/3.6 hybrid architecture, BF16/F16/F32 or NVFP4).
    #[arg(long, env = "ENGINE_MODEL")]
    pub model: Option<PathBuf>,
    /// gRPC listen address: unix:/path/to.sock (in a 0700 directory), or host:port (then
    /// pair it with --auth-token-file) [default: unix:<runtime dir>/engine.sock].
    #[arg(long, env = "ENGINE_LISTEN")]
    pub listen: Option<String>,
    /// Take the listen socket over from the engine serving it, once this one is loaded and
    /// attached: new calls reach this engine, the old one finishes its streams
    /// (deploy/swap-engine.sh). Unix sockets only.
    #[arg(long, env = "ENGINE_TAKEOVER")]
    pub takeover: bool,
    /// cache-service endpoint (unix:/path.sock or http://host:port); "none" runs uncached
    /// with a local page pool [default: unix:<runtime dir>/cache.sock].
    #[arg(long, env = "ENGINE_CACHE", value_parser = CacheSetting::from_str)]
    pub cache: Option<CacheSetting>,
    /// File holding the services' shared secret (mode 0600): required on every call to this
    /// engine and sent on every call to the cache-service. Needed on TCP, where every local
    /// user can connect.
    #[arg(long, env = "EDGE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Milliseconds the engine waits for one cache-service call (lookup, page or snapshot
    /// lease) before running that request uncached (default 100).
    #[arg(long, env = "ENGINE_CACHE_CALL_TIMEOUT_MS")]
    pub cache_call_timeout_ms: Option<u64>,
    /// Compute threads (default: all cores).
    #[arg(long, env = "ENGINE_THREADS")]
    pub threads: Option<usize>,
    /// Tokens per KV page (must match the cache-service's arena).
    #[arg(long, env = "ENGINE_PAGE_TOKENS")]
    pub page_tokens: Option<usize>,
    /// Max tokens processed in one forward pass (prefill chunk budget shared by all sequences).
    #[arg(long, env = "ENGINE_MAX_BATCH_TOKENS")]
    pub max_batch_tokens: Option<usize>,
    /// Max sequences running at once; more wait in the queue.
    #[arg(long, env = "ENGINE_MAX_RUNNING")]
    pub max_running: Option<usize>,
    /// Max queued sequences; beyond this Generate fails with RESOURCE_EXHAUSTED.
    #[arg(long, env = "ENGINE_MAX_QUEUED")]
    pub max_queued: Option<usize>,
    /// Pages of the local pool when running uncached.
    #[arg(long, env = "ENGINE_LOCAL_PAGES")]
    pub local_pages: Option<usize>,
    /// Prometheus listen address (host:port); empty disables it.
    #[arg(long, env = "ENGINE_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Speculative decoding (draft trees verified in one pass; lossless): true or false.
    #[arg(long, env = "ENGINE_SPECULATION")]
    pub speculation: Option<bool>,
    /// Draft tree shape preset (the D/k/N keys below override its parts).
    #[arg(long, env = "ENGINE_SPECULATION_PRESET")]
    pub speculation_preset: Option<SpeculationPreset>,
    /// Drafter: "suffix" (n-gram matches in the sequence's own tokens), "mtp" (the model's MTP
    /// head) or "mtp+suffix" (both, merged into one tree).
    #[arg(long, env = "ENGINE_SPECULATION_DRAFTER", value_parser = DrafterKind::from_str)]
    pub speculation_drafter: Option<DrafterKind>,
    /// D: deepest draft token (overrides the preset).
    #[arg(long, env = "ENGINE_SPECULATION_MAX_DEPTH")]
    pub speculation_max_depth: Option<usize>,
    /// k: candidates per tree node (overrides the preset).
    #[arg(long, env = "ENGINE_SPECULATION_TOP_K")]
    pub speculation_top_k: Option<usize>,
    /// N: nodes verified per pass, the last accepted token included (overrides the preset).
    #[arg(long, env = "ENGINE_SPECULATION_MAX_NODES")]
    pub speculation_max_nodes: Option<usize>,
    /// No speculation while more sequences than this decode together.
    #[arg(long, env = "ENGINE_SPECULATION_MAX_BATCH")]
    pub speculation_max_batch: Option<usize>,
    /// Draft nodes less likely than this (by draft score) are not verified (0..=1).
    #[arg(long, env = "ENGINE_SPECULATION_MIN_PROB")]
    pub speculation_min_prob: Option<f32>,
    /// Hybrid models: during a long prefill, also save a recurrent-state snapshot every this
    /// many tokens (0: only at prompt ends, hinted positions and generation ends).
    #[arg(long, env = "ENGINE_STATE_SNAPSHOT_EVERY")]
    pub state_snapshot_every: Option<usize>,
    /// KV page element type of the attention layers: "f16" (default) or "fp8" (E4M3 with
    /// per-tensor scales; half the bytes per token).
    #[arg(long, env = "ENGINE_KV_DTYPE", value_parser = KvDtype::from_str)]
    pub kv_dtype: Option<KvDtype>,
    /// Where the model runs: "auto" (default: a GPU the CUDA backend can use, else the CPU,
    /// with a log line saying why), "cpu", "cuda" or "cuda:N" (fail at start without one).
    #[arg(long, env = "ENGINE_DEVICE", value_parser = DeviceSetting::from_str)]
    pub device: Option<DeviceSetting>,
    /// Run the architecture of this Qwen3.5/3.6 `config.json` with seeded random weights and a
    /// byte-level tokenizer instead of `--model` (speed and stack tests at real sizes without
    /// a checkpoint; docs/qwen36.md).
    #[arg(long, env = "ENGINE_RANDOM_WEIGHTS_CONFIG")]
    pub random_weights_config: Option<PathBuf>,
    /// Seed of the random weights (default 0).
    #[arg(long, env = "ENGINE_RANDOM_SEED", requires = "random_weights_config")]
    pub random_seed: Option<u64>,
    /// Storage of the random weights (default bf16).
    #[arg(long, env = "ENGINE_RANDOM_DTYPE", requires = "random_weights_config")]
    pub random_dtype: Option<RandomDtype>,
}

/// Where the engine keeps KV pages: the cache-service at an endpoint, or (`none`) a local
/// page pool with no reuse across requests or restarts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheSetting {
    Uncached,
    Endpoint(String),
}

impl FromStr for CacheSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" | "" => Ok(CacheSetting::Uncached),
            url if url.starts_with("http://") || url.starts_with("https://") || url.starts_with("unix:") => {
                Ok(CacheSetting::Endpoint(url.into()))
            }
            other => {
                Err(format!("cache {other:?} must be an endpoint (unix:/path.sock, http://host:port) or \"none\""))
            }
        }
    }
}

/// Draft tree shapes with a name.
#[derive(ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SpeculationPreset {
    /// The seed runtime's shape: D=8, k=2, N=16.
    Seed,
    /// A chain: D=3, k=1, N=4.
    Linear,
}

impl SpeculationPreset {
    pub const fn shape(self) -> TreeShape {
        match self {
            SpeculationPreset::Seed => TreeShape::SEED,
            SpeculationPreset::Linear => TreeShape { max_depth: 3, top_k: 1, max_nodes: 4 },
        }
    }
}

/// TOML values of the types the flags parse with `FromStr`, so a bad value in the file reads
/// the same as a bad flag and fails at load.
fn parsed<'de, D: Deserializer<'de>, T: FromStr<Err = String>>(d: D) -> Result<Option<T>, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

/// How random weights are stored.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RandomDtype {
    Bf16,
    /// For exactness tests.
    F32,
    /// The decoder's Linears in NVFP4, the rest BF16.
    Nvfp4,
    /// Q4_K Linears with a Q6_K embedding and head (llama.cpp's Q4_K_M mix).
    #[value(name = "q4_k_m")]
    Q4KM,
}

impl RandomDtype {
    fn spec(self, seed: u64) -> RandomSpec {
        let (dtype, nvfp4) = match self {
            RandomDtype::Bf16 => (GgmlType::BF16, false),
            RandomDtype::F32 => (GgmlType::F32, false),
            RandomDtype::Nvfp4 => (GgmlType::BF16, true),
            RandomDtype::Q4KM => (GgmlType::Q4_K, false),
        };
        RandomSpec { seed, dtype, nvfp4 }
    }
}

/// The same settings as they appear in a TOML file.
#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct EngineFile {
    pub model: Option<PathBuf>,
    pub listen: Option<String>,
    #[serde(default, deserialize_with = "parsed")]
    pub cache: Option<CacheSetting>,
    pub cache_call_timeout_ms: Option<u64>,
    pub auth_token_file: Option<PathBuf>,
    pub threads: Option<usize>,
    pub page_tokens: Option<usize>,
    pub max_batch_tokens: Option<usize>,
    pub max_running: Option<usize>,
    pub max_queued: Option<usize>,
    pub local_pages: Option<usize>,
    pub metrics_listen: Option<String>,
    pub speculation: Option<bool>,
    pub speculation_preset: Option<SpeculationPreset>,
    #[serde(default, deserialize_with = "parsed")]
    pub speculation_drafter: Option<DrafterKind>,
    pub speculation_max_depth: Option<usize>,
    pub speculation_top_k: Option<usize>,
    pub speculation_max_nodes: Option<usize>,
    pub speculation_max_batch: Option<usize>,
    pub speculation_min_prob: Option<f32>,
    pub state_snapshot_every: Option<usize>,
    #[serde(default, deserialize_with = "parsed")]
    pub kv_dtype: Option<KvDtype>,
    #[serde(default, deserialize_with = "parsed")]
    pub device: Option<DeviceSetting>,
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model: PathBuf,
    pub listen: proto::transport::ListenAddr,
    /// Bind beside `listen` and take it over once ready (`--takeover`).
    pub takeover: bool,
    /// The services' shared secret, if any (`proto::transport::AuthToken`).
    pub auth_token_file: Option<PathBuf>,
    /// None: run uncached.
    pub cache: Option<String>,
    /// Deadline of one engine -> cache-service table call.
    pub cache_call_timeout: std::time::Duration,
    pub threads: usize,
    pub page_tokens: usize,
    pub max_batch_tokens: usize,
    pub max_running: usize,
    pub max_queued: usize,
    pub local_pages: usize,
    pub metrics_listen: Option<String>,
    pub speculation: SpecConfig,
    pub state_snapshot_every: usize,
    pub kv_dtype: KvDtype,
    pub device: DeviceSetting,
    /// How to draw weights when `model` is a `config.json` (random weights).
    pub random: RandomSpec,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0}: {1}")]
    File(PathBuf, String),
    #[error("invalid setting: {0}")]
    Invalid(String),
}

impl EngineConfig {
    pub fn from_args(args: EngineArgs) -> Result<EngineConfig, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File(path.clone(), e.to_string()))?;
                let table: toml::Table =
                    toml::from_str(&text).map_err(|e| ConfigError::File(path.clone(), e.to_string()))?;
                let engine = table.get("engine").cloned().unwrap_or(toml::Value::Table(Default::default()));
                engine.try_into().map_err(|e: toml::de::Error| ConfigError::File(path.clone(), e.to_string()))?
            }
            None => EngineFile::default(),
        };
        let speculation = speculation_config(&args, &file)?;
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let cache = args
            .cache
            .or(file.cache)
            .unwrap_or_else(|| CacheSetting::Endpoint(proto::transport::default_socket("cache.sock")));
        let listen = args.listen.or(file.listen).unwrap_or_else(|| proto::transport::default_socket("engine.sock"));
        let config = EngineConfig {
            // Random weights replace the model (the "file" is their config.json).
            model: args
                .random_weights_config
                .or(args.model)
                .or(file.model)
                .unwrap_or_else(|| PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf")),
            listen: listen
                .parse()
                .map_err(|e: proto::transport::TransportError| ConfigError::Invalid(e.to_string()))?,
            takeover: args.takeover,
            auth_token_file: args.auth_token_file.or(file.auth_token_file),
            cache: match cache {
                CacheSetting::Uncached => None,
                CacheSetting::Endpoint(url) => Some(url),
            },
            cache_call_timeout: args
                .cache_call_timeout_ms
                .or(file.cache_call_timeout_ms)
                .map_or(crate::memory::store::DEFAULT_CACHE_CALL_TIMEOUT, std::time::Duration::from_millis),
            threads: args.threads.or(file.threads).unwrap_or(cores).max(1),
            page_tokens: args.page_tokens.or(file.page_tokens).unwrap_or(16),
            max_batch_tokens: args.max_batch_tokens.or(file.max_batch_tokens).unwrap_or(256),
            max_running: args.max_running.or(file.max_running).unwrap_or(16),
            max_queued: args.max_queued.or(file.max_queued).unwrap_or(256),
            local_pages: args.local_pages.or(file.local_pages).unwrap_or(2048),
            metrics_listen: match args.metrics_listen.or(file.metrics_listen) {
                Some(s) if s.is_empty() => None,
                Some(s) => Some(s),
                None => Some("127.0.0.1:9091".to_string()),
            },
            speculation,
            state_snapshot_every: args
                .state_snapshot_every
                .or(file.state_snapshot_every)
                .unwrap_or(crate::step::DEFAULT_STATE_SNAPSHOT_EVERY),
            kv_dtype: args.kv_dtype.or(file.kv_dtype).unwrap_or_default(),
            device: args.device.or(file.device).unwrap_or_default(),
            random: args.random_dtype.unwrap_or(RandomDtype::Bf16).spec(args.random_seed.unwrap_or(0)),
        };
        if config.page_tokens == 0 || config.page_tokens > 1024 {
            return Err(ConfigError::Invalid(format!("page_tokens must be in 1..=1024, got {}", config.page_tokens)));
        }
        if config.cache_call_timeout.is_zero() {
            return Err(ConfigError::Invalid("cache_call_timeout_ms must be >= 1".into()));
        }
        if config.max_batch_tokens == 0 || config.max_running == 0 {
            return Err(ConfigError::Invalid("max_batch_tokens and max_running must be >= 1".into()));
        }
        Ok(config)
    }
}

/// Speculation settings: defaults, then the preset, then individual keys; flags win over
/// the file at each level.
fn speculation_config(args: &EngineArgs, file: &EngineFile) -> Result<SpecConfig, ConfigError> {
    let mut cfg = SpecConfig::default();
    if let Some(on) = args.speculation.or(file.speculation) {
        cfg.enabled = on;
    }
    cfg.shape = args.speculation_preset.or(file.speculation_preset).unwrap_or(SpeculationPreset::Seed).shape();
    if let Some(d) = args.speculation_drafter.or(file.speculation_drafter) {
        cfg.drafter = d;
    }
    if let Some(d) = args.speculation_max_depth.or(file.speculation_max_depth) {
        cfg.shape.max_depth = d;
    }
    if let Some(k) = args.speculation_top_k.or(file.speculation_top_k) {
        cfg.shape.top_k = k;
    }
    if let Some(n) = args.speculation_max_nodes.or(file.speculation_max_nodes) {
        cfg.shape.max_nodes = n;
    }
    if let Some(b) = args.speculation_max_batch.or(file.speculation_max_batch) {
        cfg.max_batch = b;
    }
    if let Some(p) = args.speculation_min_prob.or(file.speculation_min_prob) {
        if !(0.0..=1.0).contains(&p) {
            return Err(ConfigError::Invalid(format!("speculation_min_prob must be in [0, 1], got {p}")));
        }
        cfg.min_node_prob = p;
    }
    cfg.shape.validate().map_err(ConfigError::Invalid)?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_weight_flags_replace_the_model_and_need_a_config() {
        let args = EngineArgs::try_parse_from([
            "engine-service",
            "--model",
            "m.gguf",
            "--random-weights-config",
            "c/config.json",
            "--random-dtype",
            "q4_k_m",
            "--random-seed",
            "7",
        ])
        .unwrap();
        let config = EngineConfig::from_args(args).unwrap();
        assert_eq!(config.model, PathBuf::from("c/config.json"));
        assert_eq!(config.random, RandomSpec { seed: 7, dtype: GgmlType::Q4_K, nvfp4: false });
        let nvfp4 = ["engine-service", "--random-weights-config", "config.json", "--random-dtype", "nvfp4"];
        let config = EngineConfig::from_args(EngineArgs::try_parse_from(nvfp4).unwrap()).unwrap();
        assert_eq!(config.random, RandomSpec { seed: 0, dtype: GgmlType::BF16, nvfp4: true });
        assert!(EngineArgs::try_parse_from(["engine-service", "--random-seed", "7"]).is_err());
        let bad = ["engine-service", "--random-weights-config", "config.json", "--random-dtype", "q8"];
        assert!(EngineArgs::try_parse_from(bad).is_err());
    }

    /// Units and containers set services up through the environment (docs/engine.md).
    #[test]
    fn every_setting_flag_can_come_from_the_environment() {
        use clap::CommandFactory;
        let command = EngineArgs::command();
        let missing: Vec<String> = command
            .get_arguments()
            .filter(|a| a.get_long().is_some() && a.get_env().is_none())
            .map(|a| a.get_id().to_string())
            .filter(|id| !matches!(id.as_str(), "kernel_sets" | "help" | "version"))
            .collect();
        assert!(missing.is_empty(), "flags without an environment variable: {missing:?}");
    }

    #[test]
    fn deploy_config_file_parses_and_flags_win() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/edge.toml");
        let args = EngineArgs { config: Some(path), threads: Some(3), ..Default::default() };
        let config = EngineConfig::from_args(args).expect("deploy/edge.toml parses");
        assert_eq!(config.threads, 3);
        assert_eq!(config.page_tokens, 16);
        let sockets = proto::transport::runtime_dir();
        assert_eq!(config.cache, Some(format!("unix:{}", sockets.join("cache.sock").display())));
        assert_eq!(config.listen, proto::transport::ListenAddr::Unix(sockets.join("engine.sock")));
        assert_eq!(config.kv_dtype, KvDtype::F16);
    }

    #[test]
    fn kv_dtype_from_file_and_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge.toml");
        std::fs::write(&path, "[engine]\nkv_dtype = \"fp8\"\n").unwrap();
        let file = EngineConfig::from_args(EngineArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
        assert_eq!(file.kv_dtype, KvDtype::Fp8);
        let flag = EngineArgs { config: Some(path.clone()), kv_dtype: Some(KvDtype::F16), ..Default::default() };
        assert_eq!(EngineConfig::from_args(flag).unwrap().kv_dtype, KvDtype::F16);
        let bad = EngineArgs::try_parse_from(["engine-service", "--kv-dtype", "int8"]).unwrap_err();
        assert!(bad.to_string().contains("known: f16, fp8"), "{bad}");
        std::fs::write(&path, "[engine]\nkv_dtype = \"int8\"\n").unwrap();
        let bad = EngineConfig::from_args(EngineArgs { config: Some(path), ..Default::default() }).unwrap_err();
        assert!(bad.to_string().contains("known: f16, fp8"), "{bad}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge.toml");
        std::fs::write(&path, "[engine]\nthreads = 2\nthread = 3\n").unwrap();
        let err = EngineConfig::from_args(EngineArgs { config: Some(path.clone()), ..Default::default() });
        assert!(err.unwrap_err().to_string().contains("thread"));
        std::fs::write(&path, "[engine]\npage_tokens = 0\n").unwrap();
        assert!(EngineConfig::from_args(EngineArgs { config: Some(path), ..Default::default() }).is_err());
        let none = EngineArgs::try_parse_from(["engine-service", "--cache", "none"]).unwrap();
        assert!(EngineConfig::from_args(none).unwrap().cache.is_none());
        let url = EngineArgs::try_parse_from(["engine-service", "--cache", "http://10.0.0.2:50052"]).unwrap();
        assert_eq!(EngineConfig::from_args(url).unwrap().cache.as_deref(), Some("http://10.0.0.2:50052"));
        // A bare host:port is a typo for an endpoint, not a request to run uncached.
        assert!(EngineArgs::try_parse_from(["engine-service", "--cache", "127.0.0.1:50052"]).is_err());
    }

    #[test]
    fn speculation_keys_layer_preset_then_keys_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge.toml");
        let load = |args: EngineArgs| EngineConfig::from_args(EngineArgs { config: Some(path.clone()), ..args });
        std::fs::write(
            &path,
            "[engine]\nspeculation = false\nspeculation_preset = \"linear\"\nspeculation_top_k = 2\n",
        )
        .unwrap();
        let c = load(EngineArgs::default()).unwrap().speculation;
        assert!(!c.enabled);
        assert_eq!(c.shape, TreeShape { max_depth: 3, top_k: 2, max_nodes: 4 });
        let c = load(EngineArgs { speculation: Some(true), speculation_max_nodes: Some(9), ..Default::default() })
            .unwrap()
            .speculation;
        assert!(c.enabled);
        assert_eq!(c.shape.max_nodes, 9);
        std::fs::write(
            &path,
            "[engine]\nspeculation_max_batch = 2\nspeculation_drafter = \"suffix\"\nspeculation_min_prob = 0.25\n",
        )
        .unwrap();
        let c = load(EngineArgs::default()).unwrap().speculation;
        assert_eq!((c.shape, c.max_batch, c.drafter, c.min_node_prob), (TreeShape::SEED, 2, DrafterKind::Suffix, 0.25));
        for bad in [
            "speculation_preset = \"huge\"",
            "speculation_max_nodes = 1",
            "speculation_drafter = \"oracle\"",
            "speculation_min_prob = 2.0",
        ] {
            std::fs::write(&path, format!("[engine]\n{bad}\n")).unwrap();
            assert!(load(EngineArgs::default()).is_err(), "{bad}");
        }
        let flags = ["engine-service", "--speculation-preset", "linear", "--speculation-drafter", "mtp+suffix"];
        let c = EngineConfig::from_args(EngineArgs::try_parse_from(flags).unwrap()).unwrap().speculation;
        assert_eq!((c.shape, c.drafter), (SpeculationPreset::Linear.shape(), DrafterKind::MtpSuffix));
        assert!(EngineArgs::try_parse_from(["engine-service", "--speculation-preset", "huge"]).is_err());
    }
}
