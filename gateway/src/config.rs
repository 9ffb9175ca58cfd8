//! Gateway runtime configuration: command-line flags (also readable from `GATEWAY_*`
//! environment variables) over an optional TOML file (`--config`) over built-in defaults.
//!
//! Precedence is flag/env > file > default, field by field. The TOML keys are the flag names
//! with `_` instead of `-` (e.g. `engine_endpoint = "unix:/run/edge/engine.sock"`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use crate::routing::RoutePolicy;

/// A TOML value that is one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        }
    }
}

/// The resolved configuration `run` and `AppState` use.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the HTTP server listens.
    pub listen: SocketAddr,
    /// Engine gRPC endpoints, `unix:/path/to/socket` or `http://host:port`: one or more
    /// engines serving the same model (see `routing`).
    pub engine_endpoints: Vec<String>,
    /// How requests are spread over several engines (crate::routing).
    pub routing: RoutePolicy,
    /// File holding the services' shared secret (mode 0600), sent on every engine call.
    pub auth_token_file: Option<PathBuf>,
    /// Deadline for one chat completion, from arrival to the last byte.
    pub request_timeout: Duration,
    /// How long startup keeps retrying the engine's `Info` before giving up.
    pub startup_timeout: Duration,
    /// Deadline for the engine's first token (queueing and prefill included); past it the
    /// request is aborted and answered 504 `first_token_timeout`.
    pub first_token_timeout: Duration,
    /// Deadline for the engine to take a call (answer its headers); past it the request is
    /// answered 503 `engine_unavailable`. Before that it only checks limits, compiles a
    /// grammar and asks the cache (itself under a 100 ms deadline): a longer silence means a
    /// stalled engine process.
    pub engine_accept_timeout: Duration,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Open HTTP connections at most; at the limit the oldest one without a complete request
    /// is closed to make room, or the newcomer is answered 503 when every one is busy.
    pub max_connections: usize,
    /// A request's headers must arrive within this (also the idle keep-alive limit).
    pub header_read_timeout: Duration,
    /// A request's whole body must arrive within this, from its headers (408 otherwise).
    pub body_read_timeout: Duration,
    /// Chat completions served at once; more are answered 429.
    pub max_concurrent_requests: usize,
    /// Upper bound for the default `max_tokens` (which is otherwise the rest of the context).
    pub max_tokens_cap: u32,
    /// Names the model is served under (vLLM's `--served-model-name`): the first is the id
    /// responses and `/v1/models` report, all are accepted in requests. Empty: the engine's
    /// model id.
    pub served_model_names: Vec<String>,
    /// Answer 404 `model_not_found` for a `model` that is none of the served names. Off by
    /// default: a single-model server serves whatever name an agent sends (logged once per
    /// name), as llama-server does.
    pub strict_model_names: bool,
    /// Requests waiting for a concurrency slot; beyond this they are answered 429.
    pub max_queued_requests: usize,
    /// Most messages one chat request may carry.
    pub max_messages: usize,
    /// Accepted API keys (`Authorization: Bearer <key>`); empty (and no file) = no auth.
    pub api_keys: Vec<String>,
    /// File with one API key per line (`#` comments and blank lines skipped), added to `api_keys`.
    pub api_keys_file: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            engine_endpoints: vec![proto::transport::default_socket("engine.sock")],
            routing: RoutePolicy::Affine,
            auth_token_file: None,
            request_timeout: Duration::from_secs(600),
            startup_timeout: Duration::from_secs(120),
            first_token_timeout: Duration::from_secs(120),
            engine_accept_timeout: Duration::from_secs(10),
            max_body_bytes: 16 * 1024 * 1024,
            max_connections: 512,
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(60),
            max_concurrent_requests: 256,
            max_tokens_cap: 4096,
            served_model_names: Vec::new(),
            strict_model_names: false,
            max_queued_requests: 256,
            max_messages: 2048,
            api_keys: Vec::new(),
            api_keys_file: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {source}")]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("invalid value for {field}: {message}")]
    Invalid { field: &'static str, message: String },
}

/// Command-line flags; every one is optional so the file and defaults can fill gaps.
#[derive(Debug, Parser, Default)]
#[command(name = "gateway", about = "OpenAI-compatible HTTP gateway in front of engine-service")]
pub struct Cli {
    /// TOML config file (keys as the flags, with underscores).
    #[arg(long, env = "GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// HTTP listen address [default: 127.0.0.1:8080].
    #[arg(long, env = "GATEWAY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Engine endpoint, `unix:/path` or `http://host:port`; several (comma-separated, or the
    /// flag repeated) put several engines of the same model behind this gateway
    /// [default: unix:<runtime dir>/engine.sock].
    #[arg(long, alias = "engine-endpoints", env = "GATEWAY_ENGINE_ENDPOINT", value_delimiter = ',')]
    pub engine_endpoint: Option<Vec<String>>,
    /// Routing over several engines: `affine` (a conversation stays on the engine holding
    /// its prefix) or `round-robin` [default: affine].
    #[arg(long, env = "GATEWAY_ROUTING", value_enum)]
    pub routing: Option<RoutePolicy>,
    /// File holding the services' shared secret (mode 0600), for an engine that requires it.
    #[arg(long, env = "EDGE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Per-request deadline in seconds [default: 600].
    #[arg(long, env = "GATEWAY_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,
    /// Seconds to wait for the engine at startup [default: 120].
    #[arg(long, env = "GATEWAY_STARTUP_TIMEOUT_SECS")]
    pub startup_timeout_secs: Option<u64>,
    /// Seconds to wait for the first token before answering 504 [default: 120].
    #[arg(long, env = "GATEWAY_FIRST_TOKEN_TIMEOUT_SECS")]
    pub first_token_timeout_secs: Option<u64>,
    /// Seconds the engine may take to accept a call before answering 503 [default: 10].
    #[arg(long, env = "GATEWAY_ENGINE_ACCEPT_TIMEOUT_SECS")]
    pub engine_accept_timeout_secs: Option<u64>,
    /// Largest request body in bytes [default: 16777216].
    #[arg(long, env = "GATEWAY_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Open HTTP connections at most [default: 512].
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Seconds a request's headers may take to arrive [default: 30].
    #[arg(long, env = "GATEWAY_HEADER_READ_TIMEOUT_SECS")]
    pub header_read_timeout_secs: Option<u64>,
    /// Seconds a request's body may take to arrive before 408 [default: 60].
    #[arg(long, env = "GATEWAY_BODY_READ_TIMEOUT_SECS")]
    pub body_read_timeout_secs: Option<u64>,
    /// Concurrent chat completions before answering 429 [default: 256].
    #[arg(long, env = "GATEWAY_MAX_CONCURRENT_REQUESTS")]
    pub max_concurrent_requests: Option<usize>,
    /// Cap on the default max_tokens [default: 4096].
    #[arg(long, env = "GATEWAY_MAX_TOKENS_CAP")]
    pub max_tokens_cap: Option<u32>,
    /// Names to serve the model under, comma-separated; the first is reported
    /// [default: the engine's model id].
    #[arg(long, alias = "served-model-names", env = "GATEWAY_SERVED_MODEL_NAME", value_delimiter = ',')]
    pub served_model_name: Option<Vec<String>>,
    /// Answer 404 model_not_found for any other requested name [default: false].
    #[arg(long, env = "GATEWAY_STRICT_MODEL_NAMES")]
    pub strict_model_names: Option<bool>,
    /// Deprecated: `true` is the default now; `false` means `--strict-model-names true`.
    #[arg(long, env = "GATEWAY_ACCEPT_ANY_MODEL", hide = true)]
    pub accept_any_model: Option<bool>,
    /// Requests that may wait for a slot before 429 [default: 256].
    #[arg(long, env = "GATEWAY_MAX_QUEUED_REQUESTS")]
    pub max_queued_requests: Option<usize>,
    /// Most messages per chat request [default: 2048].
    #[arg(long, env = "GATEWAY_MAX_MESSAGES")]
    pub max_messages: Option<usize>,
    /// Accepted API keys, comma-separated [default: none, auth off].
    #[arg(long, env = "GATEWAY_API_KEYS", value_delimiter = ',')]
    pub api_keys: Option<Vec<String>>,
    /// File with one API key per line.
    #[arg(long, env = "GATEWAY_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
}

/// The TOML file's shape; unknown keys are rejected so typos surface.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    #[serde(alias = "engine_endpoints")]
    engine_endpoint: Option<OneOrMany>,
    routing: Option<RoutePolicy>,
    auth_token_file: Option<PathBuf>,
    request_timeout_secs: Option<u64>,
    startup_timeout_secs: Option<u64>,
    first_token_timeout_secs: Option<u64>,
    engine_accept_timeout_secs: Option<u64>,
    max_body_bytes: Option<usize>,
    max_connections: Option<usize>,
    header_read_timeout_secs: Option<u64>,
    body_read_timeout_secs: Option<u64>,
    max_concurrent_requests: Option<usize>,
    max_tokens_cap: Option<u32>,
    #[serde(alias = "served_model_name")]
    served_model_names: Option<Vec<String>>,
    strict_model_names: Option<bool>,
    /// Deprecated spelling of `strict_model_names = false` (true) / `= true` (false).
    accept_any_model: Option<bool>,
    max_queued_requests: Option<usize>,
    max_messages: Option<usize>,
    api_keys: Option<Vec<String>>,
    api_keys_file: Option<PathBuf>,
}

impl Config {
    /// Parses the process's arguments (and environment) and the file they name.
    pub fn from_cli(cli: Cli) -> Result<Config, ConfigError> {
        let file = match &cli.config {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
                Self::parse_file(&text).map_err(|source| ConfigError::Parse { path: path.clone(), source })?
            }
            None => FileConfig::default(),
        };
        let d = Config::default();
        let config = Config {
            listen: cli.listen.or(file.listen).unwrap_or(d.listen),
            engine_endpoints: cli
                .engine_endpoint
                .or(file.engine_endpoint.map(OneOrMany::into_vec))
                .map(|list| list.into_iter().map(|e| e.trim().to_owned()).collect())
                .unwrap_or(d.engine_endpoints),
            routing: cli.routing.or(file.routing).unwrap_or(d.routing),
            auth_token_file: cli.auth_token_file.or(file.auth_token_file),
            request_timeout: cli
                .request_timeout_secs
                .or(file.request_timeout_secs)
                .map(Duration::from_secs)
                .unwrap_or(d.request_timeout),
            startup_timeout: cli
                .startup_timeout_secs
                .or(file.startup_timeout_secs)
                .map(Duration::from_secs)
                .unwrap_or(d.startup_timeout),
            first_token_timeout: cli
                .first_token_timeout_secs
                .or(file.first_token_timeout_secs)
                .map(Duration::from_secs)
                .unwrap_or(d.first_token_timeout),
            engine_accept_timeout: cli
                .engine_accept_timeout_secs
                .or(file.engine_accept_timeout_secs)
                .map(Duration::from_secs)
                .unwrap_or(d.engine_accept_timeout),
            max_body_bytes: cli.max_body_bytes.or(file.max_body_bytes).unwrap_or(d.max_body_bytes),
            max_connections: cli.max_connections.or(file.max_connections).unwrap_or(d.max_connections),
            header_read_timeout: cli
                .header_read_timeout_secs
                .or(file.header_read_timeout_secs)
                .map(Duration::from_secs)
                .unwrap_or(d.header_read_timeout),
            body_read_timeout: cli
                .body_read_timeout_secs
                .or(file.body_read_timeout_secs)
                .map(Duration::from_secs)
                .unwrap_or(d.body_read_timeout),
            max_concurrent_requests: cli
                .max_concurrent_requests
                .or(file.max_concurrent_requests)
                .unwrap_or(d.max_concurrent_requests),
            max_tokens_cap: cli.max_tokens_cap.or(file.max_tokens_cap).unwrap_or(d.max_tokens_cap),
            served_model_names: cli
                .served_model_name
                .or(file.served_model_names)
                .map(|names| names.into_iter().map(|n| n.trim().to_owned()).collect())
                .unwrap_or(d.served_model_names),
            strict_model_names: cli
                .strict_model_names
                .or(file.strict_model_names)
                .or(cli.accept_any_model.or(file.accept_any_model).map(|any| !any))
                .unwrap_or(d.strict_model_names),
            max_queued_requests: cli.max_queued_requests.or(file.max_queued_requests).unwrap_or(d.max_queued_requests),
            max_messages: cli.max_messages.or(file.max_messages).unwrap_or(d.max_messages),
            api_keys: cli.api_keys.or(file.api_keys).unwrap_or(d.api_keys),
            api_keys_file: cli.api_keys_file.or(file.api_keys_file),
        };
        config.check()?;
        Ok(config)
    }

    /// The stack's one config file (deploy/edge.toml) has a table per service; the gateway
    /// reads `[gateway]`. A file without that table is read as gateway settings at top level.
    fn parse_file(text: &str) -> Result<FileConfig, toml::de::Error> {
        let table: toml::Table = toml::from_str(text)?;
        match table.get("gateway") {
            Some(gateway) => gateway.clone().try_into(),
            None => toml::Value::Table(table).try_into(),
        }
    }

    /// Every accepted API key: `api_keys` plus the lines of `api_keys_file`.
    pub fn load_api_keys(&self) -> Result<Vec<String>, ConfigError> {
        let mut keys: Vec<String> = self.api_keys.iter().map(|k| k.trim().to_owned()).collect();
        if let Some(path) = &self.api_keys_file {
            let text =
                std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
            keys.extend(
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned),
            );
        }
        Ok(keys)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |field, message: &str| Err(ConfigError::Invalid { field, message: message.to_owned() });
        if self.request_timeout.is_zero() {
            return invalid("request_timeout_secs", "must be > 0");
        }
        if self.first_token_timeout.is_zero() {
            return invalid("first_token_timeout_secs", "must be > 0");
        }
        if self.engine_accept_timeout.is_zero() {
            return invalid("engine_accept_timeout_secs", "must be > 0");
        }
        if self.max_body_bytes == 0 {
            return invalid("max_body_bytes", "must be > 0");
        }
        if self.max_connections == 0 {
            return invalid("max_connections", "must be > 0");
        }
        if self.header_read_timeout.is_zero() {
            return invalid("header_read_timeout_secs", "must be > 0");
        }
        if self.body_read_timeout.is_zero() {
            return invalid("body_read_timeout_secs", "must be > 0");
        }
        if self.max_concurrent_requests == 0 {
            return invalid("max_concurrent_requests", "must be > 0");
        }
        if self.max_messages == 0 {
            return invalid("max_messages", "must be > 0");
        }
        if self.api_keys.iter().any(|k| k.trim().is_empty()) {
            return invalid("api_keys", "keys must not be empty");
        }
        if self.served_model_names.iter().any(String::is_empty) {
            return invalid("served_model_names", "names must not be empty");
        }
        if self.max_tokens_cap == 0 {
            return invalid("max_tokens_cap", "must be > 0");
        }
        if self.engine_endpoints.is_empty() {
            return invalid("engine_endpoint", "at least one engine");
        }
        for endpoint in &self.engine_endpoints {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://") || endpoint.starts_with("unix:")) {
                return invalid("engine_endpoint", "must start with http://, https:// or unix:");
            }
        }
        let mut unique = self.engine_endpoints.clone();
        unique.sort();
        unique.dedup();
        if unique.len() != self.engine_endpoints.len() {
            return invalid("engine_endpoint", "an engine is listed twice");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The systemd units and containers set services up through the environment
    /// (deploy/systemd/edge.env).
    #[test]
    fn every_setting_flag_can_come_from_the_environment() {
        use clap::CommandFactory;
        let command = Cli::command();
        let missing: Vec<String> = command
            .get_arguments()
            .filter(|a| a.get_long().is_some() && a.get_env().is_none())
            .map(|a| a.get_id().to_string())
            .filter(|id| !matches!(id.as_str(), "help" | "version"))
            .collect();
        assert!(missing.is_empty(), "flags without an environment variable: {missing:?}");
    }

    #[test]
    fn flags_override_file_which_overrides_defaults() {
        let dir = std::env::temp_dir().join(format!("gw-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gateway.toml");
        std::fs::write(
            &path,
            "engine_endpoint = \"unix:/tmp/engine.sock\"\nmax_tokens_cap = 77\nlisten = \"0.0.0.0:9000\"\n",
        )
        .unwrap();
        let cli =
            Cli::try_parse_from(["gateway", "--config", path.to_str().unwrap(), "--listen", "127.0.0.1:9100"]).unwrap();
        let config = Config::from_cli(cli).unwrap();
        assert_eq!(config.listen, "127.0.0.1:9100".parse().unwrap());
        assert_eq!(config.engine_endpoints, ["unix:/tmp/engine.sock"]);
        assert_eq!(config.max_tokens_cap, 77);
        assert_eq!(config.max_concurrent_requests, 256);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn api_keys_come_from_flags_and_a_file() {
        let dir = std::env::temp_dir().join(format!("gw-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys");
        std::fs::write(&path, "# team keys\nsk-file-1\n\n  sk-file-2  \n").unwrap();
        let cli =
            Cli::try_parse_from(["gateway", "--api-keys", "sk-a,sk-b", "--api-keys-file", path.to_str().unwrap()])
                .unwrap();
        let config = Config::from_cli(cli).unwrap();
        assert_eq!(config.load_api_keys().unwrap(), ["sk-a", "sk-b", "sk-file-1", "sk-file-2"]);
        assert!(Config::default().load_api_keys().unwrap().is_empty());
        let missing = Config { api_keys_file: Some(dir.join("absent")), ..Config::default() };
        assert!(missing.load_api_keys().is_err());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn model_names_come_from_flags_or_the_file_and_the_old_switch_still_works() {
        let d = Config::from_cli(Cli::default()).unwrap();
        assert!(d.served_model_names.is_empty());
        assert!(!d.strict_model_names);
        let cli = Cli::try_parse_from([
            "gateway",
            "--served-model-name",
            "Qwen3.6-27B-Q4_K_M,qwen",
            "--strict-model-names",
            "true",
        ])
        .unwrap();
        let c = Config::from_cli(cli).unwrap();
        assert_eq!(c.served_model_names, ["Qwen3.6-27B-Q4_K_M", "qwen"]);
        assert!(c.strict_model_names);
        let file =
            Config::parse_file("[gateway]\nserved_model_names = [\"a\", \"b\"]\naccept_any_model = false\n").unwrap();
        assert_eq!(file.served_model_names.as_deref(), Some(&["a".to_owned(), "b".to_owned()][..]));
        let old = Config::from_cli(Cli { accept_any_model: Some(false), ..Cli::default() }).unwrap();
        assert!(old.strict_model_names);
        let empty = Cli { served_model_name: Some(vec![String::new()]), ..Cli::default() };
        assert!(Config::from_cli(empty).is_err());
    }

    #[test]
    fn unknown_file_keys_and_bad_values_are_rejected() {
        assert!(Config::parse_file("listen_addr = \"x\"").is_err());
        assert!(Config::parse_file("[gateway]\nlisten_addr = \"x\"").is_err());
        let shared = Config::parse_file("[cache]\nx = 1\n[gateway]\nmax_tokens_cap = 7\n").unwrap();
        assert_eq!(shared.max_tokens_cap, Some(7));
        let cli = Cli { engine_endpoint: Some(vec!["tcp://x".into()]), ..Cli::default() };
        assert!(Config::from_cli(cli).is_err());
        let twice = Cli { engine_endpoint: Some(vec!["unix:/a".into(), "unix:/a".into()]), ..Cli::default() };
        assert!(Config::from_cli(twice).is_err());
    }

    #[test]
    fn several_engines_come_from_a_list_in_the_file_or_the_flag() {
        let file = Config::parse_file(
            "[gateway]\nengine_endpoints = [\"unix:/run/edge/engine-0.sock\", \"http://10.0.0.2:50051\"]\nrouting = \"round-robin\"\n",
        )
        .unwrap();
        assert_eq!(file.engine_endpoint.unwrap().into_vec().len(), 2);
        assert_eq!(file.routing, Some(RoutePolicy::RoundRobin));
        let one = Config::parse_file("engine_endpoint = \"unix:/x.sock\"").unwrap();
        assert_eq!(one.engine_endpoint.unwrap().into_vec(), ["unix:/x.sock"]);
        let cli = Cli::try_parse_from([
            "gateway",
            "--engine-endpoint",
            "unix:/a.sock,unix:/b.sock",
            "--engine-endpoint",
            "unix:/c.sock",
            "--routing",
            "round-robin",
        ])
        .unwrap();
        let config = Config::from_cli(cli).unwrap();
        assert_eq!(config.engine_endpoints, ["unix:/a.sock", "unix:/b.sock", "unix:/c.sock"]);
        assert_eq!(config.routing, RoutePolicy::RoundRobin);
        assert_eq!(Config::from_cli(Cli::default()).unwrap().routing, RoutePolicy::Affine);
    }
}
