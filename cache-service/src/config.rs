//! Runtime config of the cache-service: flags, optionally a TOML file (`--config`, its
//! `[cache]` table), flags win. Parsed into validated types here; nothing else reads flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use serde::Deserialize;

pub use proto::transport::ListenAddr;

use crate::error::CacheError;

/// The socket's file name in the runtime directory (`proto::transport::runtime_dir`).
pub const DEFAULT_SOCKET: &str = "cache.sock";
pub const DEFAULT_ARENA_BYTES: u64 = 1 << 30;
pub const DEFAULT_PAGE_TOKENS: u32 = 16;
pub const DEFAULT_SHM_DIR: &str = "/dev/shm";
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9092";

#[derive(Parser, Debug, Clone, Default)]
#[command(name = "cache-service", about = "Prefix KV cache over a shared-memory arena (gRPC)")]
pub struct CacheArgs {
    /// TOML config file; its `[cache]` table sets defaults for the flags.
    #[arg(long, env = "CACHE_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address: unix:/path/to.sock (in a 0700 directory), or host:port (then
    /// pair it with --auth-token-file) [default: unix:<runtime dir>/cache.sock].
    #[arg(long, env = "CACHE_LISTEN")]
    pub listen: Option<String>,
    /// File holding the services' shared secret (mode 0600); when set, every call must
    /// carry it. Needed on TCP, where every local user can connect.
    #[arg(long, env = "EDGE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Arena size: bytes, or with a suffix (512MiB, 1GiB, 2G).
    #[arg(long, env = "CACHE_ARENA_BYTES")]
    pub arena_bytes: Option<String>,
    /// Tokens per page expected from engines (the first engine's value wins if it differs).
    #[arg(long, env = "CACHE_PAGE_TOKENS")]
    pub page_tokens: Option<u32>,
    /// Name of the arena file in --shm-dir (default edge-cache-<port or socket name>).
    #[arg(long, env = "CACHE_SHM_NAME")]
    pub shm_name: Option<String>,
    /// Directory of the arena file (a tmpfs).
    #[arg(long, env = "CACHE_SHM_DIR")]
    pub shm_dir: Option<PathBuf>,
    /// Allocate the whole arena at startup (fail early if /dev/shm is too small).
    #[arg(long, env = "CACHE_RESERVE_ARENA")]
    pub reserve_arena: Option<bool>,
    /// Prometheus listen address (host:port); empty disables it.
    #[arg(long, env = "CACHE_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Publish KV-cache events (vLLM's format, for llm-d) on this ZeroMQ endpoint, e.g.
    /// tcp://0.0.0.0:5557 [default: none].
    #[arg(long, env = "CACHE_KV_EVENTS_ENDPOINT")]
    pub kv_events_endpoint: Option<String>,
    /// The events' ZeroMQ topic; llm-d reads `kv@<pod>@<model>` [default: kv@<host name>@edge].
    #[arg(long, env = "CACHE_KV_EVENTS_TOPIC")]
    pub kv_events_topic: Option<String>,
}

/// A byte size written as an integer or a string with a unit suffix.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum ByteSize {
    Bytes(u64),
    Text(String),
}

/// The same settings as they appear in the `[cache]` table of a TOML file.
#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct CacheFile {
    pub listen: Option<String>,
    pub auth_token_file: Option<PathBuf>,
    pub arena_bytes: Option<ByteSize>,
    pub page_tokens: Option<u32>,
    pub shm_name: Option<String>,
    pub shm_dir: Option<PathBuf>,
    pub reserve_arena: Option<bool>,
    pub metrics_listen: Option<String>,
    pub kv_events_endpoint: Option<String>,
    pub kv_events_topic: Option<String>,
}

#[derive(Clone, Debug)]
pub struct CacheConfig {
    pub listen: ListenAddr,
    /// The shared secret calls must carry, if any.
    pub auth_token_file: Option<PathBuf>,
    pub arena_bytes: u64,
    pub page_tokens: u32,
    /// Full path of the arena file.
    pub arena_path: PathBuf,
    pub reserve_arena: bool,
    pub metrics_listen: Option<SocketAddr>,
    /// ZeroMQ endpoint and topic of the KV event stream (crate::events), when published.
    pub kv_events: Option<(String, String)>,
}

/// Parses `1073741824`, `1GiB`, `512MiB`, `2G`, `64k` (binary multiples).
pub fn parse_bytes(s: &str) -> Result<u64, CacheError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| CacheError::InvalidArgument(format!("bad byte size {s:?}")))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(CacheError::InvalidArgument(format!("bad byte size unit in {s:?}")));
        }
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| CacheError::InvalidArgument(format!("byte size {s:?} overflows")))
}

impl CacheConfig {
    pub fn from_args(args: CacheArgs) -> Result<CacheConfig, CacheError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => CacheFile::default(),
        };
        let listen: ListenAddr =
            args.listen.or(file.listen).unwrap_or_else(|| proto::transport::default_socket(DEFAULT_SOCKET)).parse()?;
        let arena_bytes = match (args.arena_bytes, file.arena_bytes) {
            (Some(s), _) | (None, Some(ByteSize::Text(s))) => parse_bytes(&s)?,
            (None, Some(ByteSize::Bytes(n))) => n,
            (None, None) => DEFAULT_ARENA_BYTES,
        };
        let page_tokens = args.page_tokens.or(file.page_tokens).unwrap_or(DEFAULT_PAGE_TOKENS);
        if page_tokens == 0 || page_tokens > crate::cache::MAX_PAGE_TOKENS {
            return Err(CacheError::InvalidArgument(format!("page_tokens must be in 1..=4096, got {page_tokens}")));
        }
        let shm_name = match args.shm_name.or(file.shm_name) {
            Some(name) => name,
            None => match &listen {
                ListenAddr::Tcp(addr) => format!("edge-cache-{}", addr.port()),
                // One arena per socket path: stacks of several users (or runtime directories)
                // on one box never share a file.
                ListenAddr::Unix(path) => format!(
                    "edge-cache-{}-{:08x}",
                    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "unix".into()),
                    xxhash_rust::xxh3::xxh3_64(path.as_os_str().as_encoded_bytes()) as u32
                ),
            },
        };
        if shm_name.is_empty() || shm_name.contains('/') {
            return Err(CacheError::InvalidArgument(format!("shm_name {shm_name:?} must be a plain file name")));
        }
        let shm_dir = args.shm_dir.or(file.shm_dir).unwrap_or_else(|| PathBuf::from(DEFAULT_SHM_DIR));
        let metrics_listen = match args.metrics_listen.or(file.metrics_listen) {
            Some(s) if s.is_empty() => None,
            Some(s) => Some(s),
            None => Some(DEFAULT_METRICS_LISTEN.to_string()),
        }
        .map(|s| s.parse().map_err(|_| CacheError::InvalidArgument(format!("metrics_listen {s:?} is not host:port"))))
        .transpose()?;
        Ok(CacheConfig {
            listen,
            auth_token_file: args.auth_token_file.or(file.auth_token_file),
            arena_bytes,
            page_tokens,
            arena_path: shm_dir.join(shm_name),
            reserve_arena: args.reserve_arena.or(file.reserve_arena).unwrap_or(false),
            metrics_listen,
            kv_events: match args.kv_events_endpoint.or(file.kv_events_endpoint).filter(|e| !e.is_empty()) {
                Some(endpoint) if !endpoint.starts_with("tcp://") && !endpoint.starts_with("ipc://") => {
                    return Err(CacheError::InvalidArgument(format!(
                        "kv_events_endpoint {endpoint:?} must be tcp://host:port or ipc://path"
                    )));
                }
                Some(endpoint) => {
                    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                        .map(|h| h.trim().to_owned())
                        .unwrap_or_else(|_| "localhost".into());
                    let topic = args.kv_events_topic.or(file.kv_events_topic).unwrap_or(format!("kv@{host}@edge"));
                    Some((endpoint, topic))
                }
                None => None,
            },
        })
    }
}

fn read_file(path: &PathBuf) -> Result<CacheFile, CacheError> {
    let bad = |e: String| CacheError::InvalidArgument(format!("config file {}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| CacheError::io(format!("reading {}", path.display()), e))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let cache = table.get("cache").cloned().unwrap_or(toml::Value::Table(Default::default()));
    cache.try_into().map_err(|e: toml::de::Error| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units and containers set services up through the environment (docs/engine.md).
    #[test]
    fn every_setting_flag_can_come_from_the_environment() {
        use clap::CommandFactory;
        let command = CacheArgs::command();
        let missing: Vec<String> = command
            .get_arguments()
            .filter(|a| a.get_long().is_some() && a.get_env().is_none())
            .map(|a| a.get_id().to_string())
            .filter(|id| !matches!(id.as_str(), "help" | "version"))
            .collect();
        assert!(missing.is_empty(), "flags without an environment variable: {missing:?}");
    }

    #[test]
    fn byte_sizes_accept_units() {
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("2g").unwrap(), 2 << 30);
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }

    #[test]
    fn defaults_and_derived_shm_name() {
        let c = CacheConfig::from_args(CacheArgs::default()).unwrap();
        assert_eq!(c.listen, ListenAddr::Unix(proto::transport::runtime_dir().join("cache.sock")));
        assert_eq!(c.arena_bytes, 1 << 30);
        assert_eq!(c.page_tokens, 16);
        let t =
            CacheConfig::from_args(CacheArgs { listen: Some("127.0.0.1:50052".into()), ..Default::default() }).unwrap();
        assert_eq!(t.arena_path, PathBuf::from("/dev/shm/edge-cache-50052"));
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9092".parse().unwrap()));
        let u = CacheConfig::from_args(CacheArgs {
            listen: Some("unix:/run/edge/cache.sock".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(u.listen, ListenAddr::Unix("/run/edge/cache.sock".into()));
        let name = u.arena_path.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.starts_with("edge-cache-cache-") && name.len() == "edge-cache-cache-".len() + 8, "{name}");
        assert_ne!(u.arena_path, c.arena_path, "another socket path, another arena");
    }

    #[test]
    fn the_deployed_config_file_parses() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/edge.toml");
        if path.exists() {
            let c = CacheConfig::from_args(CacheArgs { config: Some(path), ..Default::default() }).unwrap();
            assert!(c.arena_bytes > 0 && c.page_tokens > 0);
        }
    }

    #[test]
    fn file_sets_defaults_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge.toml");
        std::fs::write(
            &path,
            "[cache]\narena_bytes = \"64MiB\"\npage_tokens = 32\nmetrics_listen = \"\"\n[engine]\nx = 1\n",
        )
        .unwrap();
        let args = CacheArgs { config: Some(path.clone()), page_tokens: Some(64), ..Default::default() };
        let c = CacheConfig::from_args(args).unwrap();
        assert_eq!((c.arena_bytes, c.page_tokens, c.metrics_listen), (64 << 20, 64, None));
        std::fs::write(&path, "[cache]\nbogus = 1\n").unwrap();
        assert!(CacheConfig::from_args(CacheArgs { config: Some(path), ..Default::default() }).is_err());
    }
}
