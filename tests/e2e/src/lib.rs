//! Starts the real stack (cache-service, engine-service, gateway release binaries) on free
//! loopback ports with the default model, and stops it on drop. Binaries come from
//! `target/release` (built by the README's test command) or `$EDGE_BIN_DIR`. One stack runs
//! at a time per test process: each holds the model and both cores' worth of threads, so tests
//! wait for their turn (the harness may still run them on several threads).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub struct Stack {
    children: Vec<(String, Child)>,
    /// Arguments each service was started with (for [`Stack::respawn`]).
    args: Vec<(String, Vec<String>)>,
    pub base_url: String,
    pub cache_metrics_url: String,
    pub engine_metrics_url: String,
    /// Every engine's metrics page, in start order (the first is `engine_metrics_url`).
    pub engine_metrics_urls: Vec<String>,
    logs: PathBuf,
    /// This process's one-stack-at-a-time turn; released after the children are stopped
    /// (fields drop after `Drop::drop`).
    _turn: MutexGuard<'static, ()>,
}

static ONE_STACK_AT_A_TIME: Mutex<()> = Mutex::new(());

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

fn bin_dir() -> PathBuf {
    std::env::var_os("EDGE_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target/release"))
}

/// The default model, or `$EDGE_E2E_MODEL` (the GPU check's stand-in for it).
pub fn default_model() -> PathBuf {
    if let Some(p) = std::env::var_os("EDGE_E2E_MODEL") {
        return PathBuf::from(p);
    }
    let p = workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "default model missing at {}: run deploy/fetch-model.sh", p.display());
    p
}

/// `n` distinct free ports for one stack, picked below Linux's ephemeral range (32768+):
/// outgoing connections (the gateway's retries, the engine's cache session) take their local
/// ports from that range, so a port picked there can be taken before the service binds it.
/// The listeners are held until all `n` are picked, so no port is handed out twice.
fn free_ports(n: usize) -> Vec<u16> {
    let mut seed = std::process::id() as u64
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let port = 20_000 + ((seed >> 33) % 12_000) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    held.iter().map(|l| l.local_addr().expect("addr").port()).collect()
}

/// Extra knobs a test may turn.
#[derive(Default, Clone)]
pub struct StackOptions {
    /// The engine's `--model` (a GGUF file or an HF checkpoint directory); the default
    /// model when `None`.
    pub model: Option<PathBuf>,
    pub engine_args: Vec<String>,
    pub gateway_args: Vec<String>,
    pub cache_args: Vec<String>,
    /// Engines behind the gateway (0 counts as 1). The second and later are named
    /// `engine-service-1`, ...; each listens on `<runtime>/engine-<i>.sock`.
    pub engines: usize,
    /// With several engines: one cache-service per engine (`cache-service-1`, ...: separate
    /// arenas, as on separate boxes) instead of one shared by all.
    pub cache_per_engine: bool,
}

impl Stack {
    pub fn start() -> Stack {
        Stack::start_with(StackOptions::default())
    }

    pub fn start_with(opts: StackOptions) -> Stack {
        // A test that panicked with its stack up poisons the lock; its stack is stopped anyway.
        let turn = ONE_STACK_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let bins = bin_dir();
        for b in ["cache-service", "engine-service", "gateway"] {
            assert!(
                bins.join(b).exists(),
                "{} not found: build the release binaries first (cargo build --release --bins)",
                bins.join(b).display()
            );
        }
        let engines = opts.engines.max(1);
        let caches = if opts.cache_per_engine { engines } else { 1 };
        let ports = free_ports(1 + engines + caches);
        let logs = std::env::temp_dir().join(format!("edge-e2e-{}-{}", std::process::id(), ports[0]));
        std::fs::create_dir_all(&logs).expect("log dir");
        let http_port = ports[0];
        let engine_metrics: Vec<u16> = ports[1..1 + engines].to_vec();
        let cache_metrics: Vec<u16> = ports[1 + engines..].to_vec();
        let metrics_url = |port: &u16| format!("http://127.0.0.1:{port}/metrics");
        let mut stack = Stack {
            children: Vec::new(),
            args: Vec::new(),
            base_url: format!("http://127.0.0.1:{http_port}"),
            cache_metrics_url: metrics_url(&cache_metrics[0]),
            engine_metrics_url: metrics_url(&engine_metrics[0]),
            engine_metrics_urls: engine_metrics.iter().map(metrics_url).collect(),
            logs: logs.clone(),
            _turn: turn,
        };
        let runtime = stack.runtime_dir();
        let numbered = |base: &str, i: usize| if i == 0 { base.to_string() } else { format!("{base}-{i}") };
        for (i, port) in cache_metrics.iter().enumerate() {
            let shm_name = format!("edge-e2e-{}-{http_port}-{i}", std::process::id());
            // One stack's services find each other's sockets in the runtime directory, as
            // deployed: no listen or endpoint flags for one engine and one cache.
            let mut cache_args =
                vec!["--metrics-listen".to_string(), format!("127.0.0.1:{port}"), "--shm-name".into(), shm_name];
            if i > 0 {
                cache_args.extend(["--listen".to_string(), format!("unix:{}/cache-{i}.sock", runtime.display())]);
            }
            // A test may size the arena itself (clap refuses a repeated flag).
            if !opts.cache_args.iter().any(|a| a == "--arena-bytes") {
                cache_args.extend(["--arena-bytes".to_string(), (256u64 << 20).to_string()]);
            }
            cache_args.extend(opts.cache_args.iter().cloned());
            stack.spawn(&numbered("cache-service", i), &bins, &cache_args);
        }
        let mut engine_endpoints = Vec::new();
        for (i, port) in engine_metrics.iter().enumerate() {
            let mut engine_args = vec![
                "--model".to_string(),
                opts.model.clone().unwrap_or_else(default_model).display().to_string(),
                "--metrics-listen".into(),
                format!("127.0.0.1:{port}"),
            ];
            if engines > 1 {
                let socket = format!("unix:{}/engine-{i}.sock", runtime.display());
                engine_args.extend(["--listen".to_string(), socket.clone()]);
                engine_endpoints.push(socket);
            }
            if caches > 1 && i > 0 {
                engine_args.extend(["--cache".to_string(), format!("unix:{}/cache-{i}.sock", runtime.display())]);
            }
            engine_args.extend(opts.engine_args.iter().cloned());
            stack.spawn(&numbered("engine-service", i), &bins, &engine_args);
        }
        let mut gateway_args = vec!["--listen".to_string(), format!("127.0.0.1:{http_port}")];
        if engines > 1 {
            gateway_args.extend(["--engine-endpoint".to_string(), engine_endpoints.join(",")]);
        }
        gateway_args.extend(opts.gateway_args.iter().cloned());
        stack.spawn("gateway", &bins, &gateway_args);
        stack.wait_healthy(Duration::from_secs(120));
        stack
    }

    fn spawn(&mut self, name: &str, bins: &Path, args: &[String]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{name}.log")))
            .expect("log file");
        self.args.retain(|(n, _)| n != name);
        self.args.push((name.to_string(), args.to_vec()));
        // `engine-service-1` runs the `engine-service` binary.
        let binary = match name.rsplit_once('-') {
            Some((base, n)) if n.parse::<usize>().is_ok() => base,
            _ => name,
        };
        let mut cmd = Command::new(bins.join(binary));
        cmd.args(args)
            .env("RUST_LOG", "info")
            .env("EDGE_RUNTIME_DIR", self.runtime_dir())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        self.children.push((name.to_string(), child));
    }

    fn wait_healthy(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let url = format!("{}/health", self.base_url);
        loop {
            if let Ok(200) = http_probe::get_status(&url) {
                return;
            }
            let exited = self
                .children
                .iter_mut()
                .find_map(|(name, child)| child.try_wait().ok().flatten().map(|status| (name.clone(), status)));
            if let Some((name, status)) = exited {
                panic!("{name} exited during startup ({status}); logs:\n{}", self.log_tail());
            }
            if Instant::now() > deadline {
                panic!("stack not healthy after {timeout:?}; logs:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// This stack's runtime directory (its sockets; 0700, made by the first service).
    pub fn runtime_dir(&self) -> PathBuf {
        self.logs.join("run")
    }

    /// The last lines of every service's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut out = String::new();
        for (name, _) in &self.children {
            let text = std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {name} ---\n{}\n", lines[lines.len().saturating_sub(30)..].join("\n")));
        }
        out
    }

    /// Sends `signal` (e.g. `libc::SIGKILL`) to one service and waits for it to exit.
    pub fn kill(&mut self, name: &str, signal: i32) {
        let (_, child) =
            self.children.iter_mut().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no service {name}"));
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
        let _ = child.wait();
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`, `libc::SIGCONT`) to one service without waiting.
    pub fn signal(&mut self, name: &str, signal: i32) {
        let (_, child) = self.children.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no service {name}"));
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
    }

    /// Starts a stopped service again with the arguments it had (same ports, same shm name).
    pub fn respawn(&mut self, name: &str) {
        let args = self
            .args
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
            .unwrap_or_else(|| panic!("no service {name}"));
        let index = self.children.iter().position(|(n, _)| n == name).expect("known service");
        let (_, mut old) = self.children.remove(index);
        let _ = old.kill();
        let _ = old.wait();
        self.spawn(name, &bin_dir(), &args);
        // Keep the start order (gateway last), which Drop relies on.
        let new = self.children.pop().expect("just spawned");
        self.children.insert(index, new);
    }

    /// The process id of a running service.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.iter().find(|(n, _)| n == name).map(|(_, c)| c.id())
    }

    /// Where the services' logs (`<name>.log`) are written.
    pub fn log_dir(&self) -> &Path {
        &self.logs
    }

    /// Whether every process is still running.
    pub fn all_alive(&mut self) -> bool {
        self.children.iter_mut().all(|(_, c)| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // Gateway first, cache last: the order a clean shutdown takes.
        for (_, child) in self.children.iter_mut().rev() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// For a test (or part of one) that needs what this machine lacks: fails, naming `why`,
/// unless `EDGE_ALLOW_SKIP=1`, in which case it reports "skipped: `why`" and the caller
/// returns. A skipped test is never counted as passed by accident.
pub fn skip_or_fail(why: &str) {
    assert!(std::env::var("EDGE_ALLOW_SKIP").as_deref() == Ok("1"), "{why} (EDGE_ALLOW_SKIP=1 skips)");
    eprintln!("skipped: {why}");
}

/// Whether `program --version` runs here.
pub fn have_tool(program: &str) -> bool {
    std::process::Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// GET `url` and return the body (e.g. a Prometheus page).
pub fn http_get(url: &str) -> std::io::Result<String> {
    http_probe::get_body(url)
}

/// The HTTP status of a GET to `url` (e.g. `/health`).
pub fn http_status(url: &str) -> std::io::Result<u16> {
    http_probe::get_status(url)
}

/// The value of one Prometheus sample line `name{labels} value` (`name` includes the labels
/// exactly as rendered, e.g. `edge_cache_tokens_hit_total{kind="partial_page"}`); 0 if absent.
pub fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

mod http_probe {
    /// Minimal blocking GET returning the body (Connection: close, no chunked decoding needed
    /// for the small pages the services render, but chunked bodies are tolerated by callers
    /// that only search lines).
    pub fn get_body(url: &str) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let rest = url.strip_prefix("http://").unwrap_or(url);
        let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
        let mut s = std::net::TcpStream::connect(host)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n")?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        Ok(buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }

    /// Minimal blocking GET for the health poll, without pulling reqwest's blocking client.
    pub fn get_status(url: &str) -> std::io::Result<u16> {
        use std::io::{Read, Write};
        let rest = url.strip_prefix("http://").unwrap_or(url);
        let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
        let mut s = std::net::TcpStream::connect(host)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")?;
        let mut buf = String::new();
        s.read_to_string(&mut buf)?;
        let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        Ok(code)
    }
}

impl Stack {
    /// Stops `name` and starts it again with its arguments changed by `edit` (e.g. another
    /// `--model`); later [`Stack::respawn`] calls keep the edited arguments.
    pub fn respawn_with(&mut self, name: &str, edit: impl FnOnce(&mut Vec<String>)) {
        let entry = self.args.iter_mut().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no service {name}"));
        edit(&mut entry.1);
        self.respawn(name);
    }
}

/// A greedy chat request with a shared 12-sentence system prompt (so prompts share a cached
/// prefix) asking to explain `topic`, for at most `max_tokens` tokens.
pub fn explain_request(topic: &str, max_tokens: u32) -> serde_json::Value {
    serde_json::json!({
        "messages": [
            {"role": "system", "content": "You are a precise assistant. ".repeat(12)},
            {"role": "user", "content": format!("Explain {topic} in two sentences.")}
        ],
        "temperature": 0,
        "max_tokens": max_tokens
    })
}

/// An HTTP client for talking to the gateway like a user (generous timeout: a slow 2-core
/// machine runs these tests).
pub fn client() -> ::reqwest::Client {
    ::reqwest::Client::builder().timeout(Duration::from_secs(300)).build().expect("client")
}

/// POSTs a chat completion; returns the status and the body (JSON, or the raw text as a string).
pub async fn chat(stack: &Stack, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let resp =
        client().post(format!("{}/v1/chat/completions", stack.base_url)).json(body).send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
}

/// Sends `body` until it succeeds (a restarted service takes a moment to load and attach).
pub async fn chat_until_ok(stack: &Stack, body: &serde_json::Value) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sent = client().post(format!("{}/v1/chat/completions", stack.base_url)).json(body).send().await;
        if let Ok(resp) = sent {
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            if status == 200 {
                return serde_json::from_str(&text).expect("json body");
            }
            assert!(Instant::now() < deadline, "no success: {status} {text}\n{}", stack.log_tail());
        } else {
            assert!(Instant::now() < deadline, "gateway unreachable\n{}", stack.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The assistant's text of a non-streamed chat completion.
pub fn content(v: &serde_json::Value) -> String {
    v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string()
}

/// `usage.prompt_tokens_details.cached_tokens` (0 when absent).
pub fn cached_tokens(v: &serde_json::Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)
}

/// `usage.prompt_tokens` (0 when absent).
pub fn prompt_tokens(v: &serde_json::Value) -> u64 {
    v["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
}

/// Streams one chat; returns the concatenated content, the finish reason, the usage chunk
/// and whether `[DONE]` ended the stream.
pub async fn chat_streamed(stack: &Stack, body: serde_json::Value) -> (String, String, serde_json::Value, bool) {
    let mut resp =
        client().post(format!("{}/v1/chat/completions", stack.base_url)).json(&body).send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap_or("").to_string());
    assert!(content_type.unwrap_or_default().starts_with("text/event-stream"));
    let mut raw = Vec::new();
    while let Some(chunk) = resp.chunk().await.expect("chunk") {
        raw.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(raw).expect("SSE is UTF-8");
    let (mut out, mut finish, mut usage, mut done) = (String::new(), String::new(), serde_json::Value::Null, false);
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("bad chunk {data}: {e}"));
        assert_eq!(v["object"], "chat.completion.chunk");
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            out.push_str(c);
        }
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (out, finish, usage, done)
}

/// `EDGE_PYTHON`, else the repo's `.venv` (made by `deploy/python-env.sh`), else `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("EDGE_PYTHON") {
        return p.into();
    }
    let venv = workspace_root().join(".venv/bin/python3");
    if venv.exists() { venv } else { "python3".into() }
}

/// Runs an official-SDK Python script (which must `import module`) against a stack with the API
/// key `sk-sdk` and strict model names (an unknown model is the API's 404); the script gets the
/// gateway's URL in `EDGE_BASE_URL` and passes when it prints `sdk ok`.
pub fn run_sdk_script(module: &str, script: &str) {
    let python = python();
    let probe = Command::new(&python).args(["-c", &format!("import {module}")]).status();
    assert!(
        matches!(probe, Ok(s) if s.success()),
        "{} has no `{module}` package: run deploy/python-env.sh (deploy/test.sh does)",
        python.display()
    );
    let gateway_args = ["--api-keys", "sk-sdk", "--strict-model-names", "true"].map(String::from).to_vec();
    let stack = Stack::start_with(StackOptions { gateway_args, ..StackOptions::default() });
    let out =
        Command::new(&python).args(["-c", script]).env("EDGE_BASE_URL", &stack.base_url).output().expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("sdk ok"),
        "{module} SDK script failed:\n{stdout}\n{stderr}\nlogs:\n{}",
        stack.log_tail()
    );
}
