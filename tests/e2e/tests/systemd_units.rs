//! The systemd units (deploy/systemd/) and their installer (deploy/install.sh).
//!
//! - `systemd-analyze verify` is clean on the units as committed (in a scratch root holding
//!   the system's own units and stand-in binaries at the units' paths) and as installed.
//! - The installed units' `ExecStart=` lines, started the way systemd starts them, give a
//!   healthy stack that serves a chat: the `EnvironmentFile=` (whose settings win over
//!   `Environment=` and over edge.toml), `WorkingDirectory=`, `UMask=`, the 0700
//!   `RuntimeDirectory=`, `Type=notify` (each unit is started once the one it is ordered
//!   after said READY=1 on `NOTIFY_SOCKET`), and SIGTERM for `systemctl stop`, which each
//!   service answers with STOPPING=1 and a clean exit.
//! - The engine unit's `ExecReload=` (`systemctl reload edge-engine`), run as systemd runs it
//!   (the unit's environment, `$MAINPID`): the new engine says MAINPID= and READY=1, the old
//!   one exits cleanly without STOPPING=1, and the stack serves on.
//!
//! Two things differ from a real boot, both because they are the machine's own: the runtime
//! directory is made under the test's directory instead of /run, and the services run as the
//! user running the test instead of `User=edge`.
//!
//! Needs `systemd-analyze` (Debian's `systemd` package); without it the verify test fails
//! unless EDGE_ALLOW_SKIP=1, which reports it skipped by name.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const UNITS: [&str; 3] = ["edge-cache.service", "edge-engine.service", "edge-gateway.service"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("edge-units-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `deploy/install.sh --no-start --no-build` into `root` (prefix, config, state and unit
/// directories under it), with the default model.
fn stage_install(root: &Path) -> PathBuf {
    let units = root.join("units");
    let out = Command::new(repo().join("deploy/install.sh"))
        .args(["--no-start", "--no-build", "--prefix"])
        .arg(root.join("opt/edge"))
        .arg("--config-dir")
        .arg(root.join("etc/edge"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .arg("--unit-dir")
        .arg(&units)
        .arg("--model")
        .arg(e2e::default_model())
        .output()
        .expect("run deploy/install.sh");
    assert!(out.status.success(), "install.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    units
}

fn unit_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "service" || x == "target"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "three services and edge.target in {}", dir.display());
    files
}

/// `systemd-analyze verify` with nothing on stderr: warnings (an unknown key, a bad value)
/// count as failures.
fn assert_verifies(extra: &[&str], files: &[PathBuf]) {
    let out = Command::new("systemd-analyze").arg("verify").args(extra).args(files).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "systemd-analyze verify {files:?}:\n{stderr}");
}

#[test]
fn units_pass_systemd_analyze_verify_as_committed_and_as_installed() {
    if !e2e::have_tool("systemd-analyze") {
        e2e::skip_or_fail(
            "units_pass_systemd_analyze_verify_as_committed_and_as_installed: systemd-analyze not found (apt-get install systemd)",
        );
        return;
    }
    // As committed: a root with the system's units (the targets ours are ordered against)
    // and stand-ins at the ExecStart paths, which verify requires to be executable.
    let root = scratch("verify");
    let system = root.join("usr/lib/systemd");
    std::fs::create_dir_all(&system).unwrap();
    let copied = Command::new("cp").arg("-a").arg("/usr/lib/systemd/system").arg(&system).status().unwrap();
    assert!(copied.success(), "copy /usr/lib/systemd/system");
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    let bin = root.join("opt/edge/bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["cache-service", "engine-service", "gateway", "swap-engine.sh"] {
        std::fs::copy("/bin/true", bin.join(name)).unwrap();
    }
    let unit_dir = root.join("etc/systemd/system");
    std::fs::create_dir_all(&unit_dir).unwrap();
    let mut committed = Vec::new();
    for file in unit_files(&repo().join("deploy/systemd")) {
        let to = unit_dir.join(file.file_name().unwrap());
        std::fs::copy(&file, &to).unwrap();
        committed.push(to);
    }
    assert_verifies(&[&format!("--root={}", root.display())], &committed);

    // As installed, on this machine's systemd, with the real binaries at the real paths.
    let installed = scratch("verify-installed");
    let units = stage_install(&installed);
    assert_verifies(&[], &unit_files(&units));
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&installed);
}

/// The `[Service]` settings a unit starts with, in the order systemd applies them.
#[derive(Debug, Default)]
struct ServiceSection {
    kind: String,
    exec_start: Vec<String>,
    exec_reload: Vec<String>,
    environment: Vec<(String, String)>,
    environment_files: Vec<PathBuf>,
    working_directory: PathBuf,
    runtime_directory: String,
    runtime_directory_mode: u32,
    umask: u32,
    after: Vec<String>,
}

fn parse_unit(path: &Path) -> ServiceSection {
    let text = std::fs::read_to_string(path).unwrap();
    let mut unit = ServiceSection { umask: 0o022, runtime_directory_mode: 0o755, ..Default::default() };
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with(['#', ';', '['])) {
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("{}: not KEY=VALUE: {line}", path.display()));
        match key {
            "Type" => unit.kind = value.to_string(),
            "ExecStart" => unit.exec_start = value.split_whitespace().map(str::to_string).collect(),
            "ExecReload" => unit.exec_reload = value.split_whitespace().map(str::to_string).collect(),
            "Environment" => {
                let (k, v) = value.split_once('=').expect("Environment=KEY=VALUE");
                unit.environment.push((k.to_string(), v.to_string()));
            }
            "EnvironmentFile" => unit.environment_files.push(PathBuf::from(value)),
            "WorkingDirectory" => unit.working_directory = PathBuf::from(value),
            "RuntimeDirectory" => unit.runtime_directory = value.to_string(),
            "RuntimeDirectoryMode" => unit.runtime_directory_mode = u32::from_str_radix(value, 8).unwrap(),
            "UMask" => unit.umask = u32::from_str_radix(value, 8).unwrap(),
            "After" => unit.after.extend(value.split_whitespace().map(str::to_string)),
            _ => {}
        }
    }
    unit
}

/// systemd's EnvironmentFile= format: KEY=VALUE lines, `#`/`;` comments, optional quotes.
fn read_environment_file(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{}: not KEY=VALUE: {l}", path.display()));
            let v = v.trim();
            let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v);
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

/// The started services; any still running when the test ends (a failure) are killed.
struct Services(Vec<(String, Child)>);

impl Drop for Services {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The next notification on the manager's socket, as `KEY=VALUE` lines.
fn next_notification(socket: &UnixDatagram, within: Duration, children: &mut [(String, Child)], logs: &Path) -> String {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        match socket.recv(&mut buf) {
            Ok(n) => return String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("notify socket: {e}"),
        }
        for (name, child) in children.iter_mut() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{name} exited ({status}) before notifying; logs:\n{}", log_tail(logs));
            }
        }
        assert!(Instant::now() < deadline, "no notification within {within:?}; logs:\n{}", log_tail(logs));
    }
}

fn log_tail(logs: &Path) -> String {
    let mut out = String::new();
    for unit in UNITS {
        let text = std::fs::read_to_string(logs.join(format!("{unit}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!("--- {unit}\n{}\n", lines[lines.len().saturating_sub(20)..].join("\n")));
    }
    out
}

/// One chat turn: (status, body).
async fn chat(base: &str) -> (u16, serde_json::Value) {
    let reply = e2e::client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&e2e::explain_request("systemd", 8))
        .send()
        .await
        .unwrap();
    let status = reply.status().as_u16();
    (status, reply.json().await.unwrap_or(serde_json::Value::Null))
}

/// Stops the engine that came in by the reload (a child of this process since its parent
/// exited): STOPPING=1 and exit 0, as for the others.
fn stop_adopted(pid: i32, notify: &UnixDatagram, logs: &Path) {
    // SAFETY: kill with the pid of a process this test adopted and has not reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let note = next_notification(notify, Duration::from_secs(30), &mut [], logs);
    assert!(note.lines().any(|l| l == "STOPPING=1"), "the reloaded engine said {note:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own (adopted) child with a valid status pointer.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if reaped == pid {
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the reloaded engine: status {status}");
            return;
        }
        assert!(Instant::now() < deadline, "the reloaded engine did not stop within 30 s; logs:\n{}", log_tail(logs));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_units_exec_lines_bring_up_a_healthy_stack_and_reload_the_engine() {
    let root = scratch("exec");
    let units = stage_install(&root);
    // The operator's environment file: ports free on this machine, a test-only arena.
    let (http, cache_metrics, engine_metrics) = (free_port(), free_port(), free_port());
    let shm_name = format!("edge-units-{}", std::process::id());
    let env_file = root.join("etc/edge/edge.env");
    let mut env_text = std::fs::read_to_string(&env_file).unwrap();
    env_text.push_str(&format!(
        "GATEWAY_LISTEN=127.0.0.1:{http}\nCACHE_METRICS_LISTEN=127.0.0.1:{cache_metrics}\n\
         ENGINE_METRICS_LISTEN=\"127.0.0.1:{engine_metrics}\"\nCACHE_SHM_NAME={shm_name}\nCACHE_ARENA_BYTES=268435456\n"
    ));
    std::fs::write(&env_file, env_text).unwrap();

    let parsed: Vec<ServiceSection> = UNITS.iter().map(|u| parse_unit(&units.join(u))).collect();
    // The start order is the units' own: each is ordered after the one before it.
    assert!(parsed[1].after.iter().any(|a| a == UNITS[0]), "engine After= cache: {:?}", parsed[1].after);
    assert!(parsed[2].after.iter().any(|a| a == UNITS[1]), "gateway After= engine: {:?}", parsed[2].after);

    let logs = root.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let notify_path = root.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let run = root.join("run");
    let mut services = Services(Vec::new());
    let mut unit_env = Vec::new();
    for (unit, service) in UNITS.iter().zip(&parsed) {
        assert_eq!(service.kind, "notify", "{unit}");
        assert_eq!(service.runtime_directory, "edge", "{unit}");
        let runtime_dir = run.join(&service.runtime_directory);
        std::fs::create_dir_all(&runtime_dir).unwrap();
        std::fs::set_permissions(&runtime_dir, std::fs::Permissions::from_mode(service.runtime_directory_mode))
            .unwrap();
        // systemd's order: Environment=, then EnvironmentFile= (which wins), then its own.
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        env.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
        for (k, v) in &service.environment {
            let v = if v == "/run/edge" { runtime_dir.display().to_string() } else { v.clone() };
            env.insert(k.clone(), v);
        }
        for file in &service.environment_files {
            env.extend(read_environment_file(file));
        }
        env.insert("RUNTIME_DIRECTORY".into(), runtime_dir.display().to_string());
        env.insert("NOTIFY_SOCKET".into(), notify_path.display().to_string());
        env.insert("INVOCATION_ID".into(), format!("{:032x}", std::process::id()));
        unit_env.push(env.clone());
        let log = std::fs::File::create(logs.join(format!("{unit}.log"))).unwrap();
        let umask = service.umask;
        let mut cmd = Command::new(&service.exec_start[0]);
        cmd.args(&service.exec_start[1..])
            .env_clear()
            .envs(&env)
            .current_dir(&service.working_directory)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: umask is async-signal-safe and touches nothing but the child's mask.
        unsafe {
            cmd.pre_exec(move || {
                libc::umask(umask as libc::mode_t);
                Ok(())
            });
        }
        services.0.push((unit.to_string(), cmd.spawn().unwrap_or_else(|e| panic!("{unit}: {e}"))));
        let note = next_notification(&notify, Duration::from_secs(180), &mut services.0, &logs);
        assert!(note.lines().any(|l| l == "READY=1"), "{unit} said {note:?}");
    }

    // Healthy, and serving a chat, on the address the environment file gave.
    let base = format!("http://127.0.0.1:{http}");
    assert_eq!(e2e::http_status(&format!("{base}/health")).unwrap(), 200);
    let (status, body) = chat(&base).await;
    assert_eq!(status, 200, "{body}");
    assert!(!e2e::content(&body).is_empty(), "{body}");
    // The arena and the sockets are the service user's alone.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&PathBuf::from("/dev/shm").join(&shm_name)), 0o600, "arena");
    for socket in ["cache.sock", "engine.sock"] {
        assert_eq!(mode(&run.join("edge").join(socket)), 0o600, "{socket}");
    }
    let page = e2e::http_get(&format!("http://127.0.0.1:{engine_metrics}/metrics")).unwrap();
    assert!(page.contains("edge_engine_"), "engine metrics on the port the env file gave");

    // `systemctl reload edge-engine`: ExecReload= with the unit's environment and $MAINPID.
    // The new engine says it is the main process (MAINPID=, READY=1); the old one drains and
    // exits cleanly without STOPPING=1, which would make systemd stop the unit.
    let engine = &parsed[1];
    assert!(!engine.exec_reload.is_empty(), "edge-engine.service has ExecReload=");
    let reload_log = std::fs::File::create(logs.join("reload.log")).unwrap();
    let old_engine = services.0[1].1.id();
    // The new engine outlives the reload's process, as under systemd: adopt it to reap it.
    // SAFETY: prctl with an integer flag; it changes nothing but this process's reaping.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    let mut reload = Command::new(&engine.exec_reload[0])
        .args(&engine.exec_reload[1..])
        .env_clear()
        .envs(&unit_env[1])
        .env("MAINPID", old_engine.to_string())
        .current_dir(&engine.working_directory)
        .stdin(Stdio::null())
        .stdout(reload_log.try_clone().unwrap())
        .stderr(reload_log)
        .spawn()
        .unwrap();
    let note = next_notification(&notify, Duration::from_secs(180), &mut [], &logs);
    let new_engine: i32 = note
        .lines()
        .find_map(|l| l.strip_prefix("MAINPID="))
        .unwrap_or_else(|| panic!("the new engine says MAINPID=: {note:?}"))
        .parse()
        .unwrap();
    assert!(note.lines().any(|l| l == "READY=1"), "{note:?}");
    assert_ne!(new_engine as u32, old_engine);
    let reloaded = reload.wait().unwrap();
    let reload_text = std::fs::read_to_string(logs.join("reload.log")).unwrap();
    assert!(reloaded.success(), "ExecReload= failed:\n{reload_text}");
    let old_status = services.0[1].1.wait().unwrap();
    assert!(old_status.success(), "the old engine drained and exited: {old_status}");
    let mut buf = [0u8; 4096];
    notify.set_nonblocking(true).unwrap();
    while let Ok(n) = notify.recv(&mut buf) {
        let note = String::from_utf8_lossy(&buf[..n]);
        assert!(!note.contains("STOPPING=1"), "the replaced engine told the manager it stops: {note:?}");
    }
    notify.set_nonblocking(false).unwrap();
    // The engine's log now goes where the reload's went (the journal, under systemd).
    assert!(reload_text.contains("took the socket over"), "{reload_text}");
    let (status, body) = chat(&base).await;
    assert_eq!(status, 200, "served by the new engine: {body}");
    services.0.remove(1);

    // `systemctl stop edge.target`: SIGTERM in the reverse order; STOPPING=1 and exit 0.
    while let Some((unit, mut child)) = services.0.pop() {
        if unit == UNITS[0] {
            // The reloaded engine, between the gateway and the cache-service.
            stop_adopted(new_engine, &notify, &logs);
        }
        // SAFETY: kill with a valid pid of our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let note = next_notification(&notify, Duration::from_secs(30), &mut [], &logs);
        assert!(note.lines().any(|l| l == "STOPPING=1"), "{unit} said {note:?}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{unit} did not stop within 30 s; logs:\n{}", log_tail(&logs));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{unit} exited {status}; logs:\n{}", log_tail(&logs));
    }
    assert!(!PathBuf::from("/dev/shm").join(&shm_name).exists(), "the cache-service removes its arena on stop");
    let _ = std::fs::remove_dir_all(&root);
}
