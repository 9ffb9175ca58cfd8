//! The units under a real systemd as PID 1: a container (systemd-nspawn, no network but its
//! own loopback) boots this machine's systemd with a copy of its /etc and its /usr read-only,
//! and runs `tests/e2e/systemd/boot-check.sh` as the one unit it boots to. The script runs
//! `deploy/install.sh` as an operator would (the `edge` user, /opt/edge, /etc/edge, the units
//! enabled and edge.target started) and checks, as systemd runs the stack:
//!
//! - the three units active and enabled, each service running as `edge`, the arena and
//!   /run/edge belonging to `edge` alone;
//! - a chat served, its second turn from the cache;
//! - `systemctl reload edge-engine` under a steady load: no failed turn, a new main pid, the
//!   unit active throughout with no restart, the old engine gone, the new one warm;
//! - `deploy/install.sh` again over the running stack (an upgrade): the engine swapped by a
//!   reload, the cache-service kept, no failed turn;
//! - an engine killed: systemd restarts only it, and it is warm;
//! - `systemctl stop edge.target`: every unit inactive, not failed, and the arena removed.
//!
//! What differs from a Jetson: the container shares this machine's kernel and its cgroup
//! setup, and has no GPU. Needs root and `systemd-nspawn` (Debian's `systemd-container`);
//! without them the test fails unless EDGE_ALLOW_SKIP=1, which reports it skipped by name.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NAME: &str = "the_units_run_under_systemd_as_pid_1";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A root for the container: the host's /usr (bound read-only at boot), a copy of its /etc,
/// and empty directories for the rest.
fn container_root(dir: &Path) {
    for sub in ["dev", "proc", "sys", "run", "tmp", "var/tmp", "var/lib", "var/log", "usr", "root", "opt", "srv", "out"]
    {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    for link in ["bin", "lib", "lib64", "sbin"] {
        if Path::new("/usr").join(link).exists() {
            std::os::unix::fs::symlink(format!("usr/{link}"), dir.join(link)).unwrap();
        }
    }
    let copied = Command::new("cp").args(["-a", "/etc"]).arg(dir.join("etc")).status().unwrap();
    assert!(copied.success(), "copy /etc");
    // nspawn looks for os-release before /usr is mounted; an empty machine-id makes systemd
    // give this boot its own.
    let os_release = dir.join("etc/os-release");
    let _ = std::fs::remove_file(&os_release);
    std::fs::copy("/usr/lib/os-release", &os_release).unwrap();
    std::fs::write(dir.join("etc/machine-id"), "").unwrap();
    let model_name = e2e::default_model().file_name().unwrap().to_string_lossy().into_owned();
    let unit = format!(
        "[Unit]\nDescription=edge units check (tests/e2e/tests/systemd_boot.rs)\n\
         Wants=network.target\nAfter=basic.target\n\n\
         [Service]\nType=oneshot\nEnvironment=EDGE_CHECK_MODEL=/srv/model/{model_name}\n\
         ExecStart=/srv/edge/tests/e2e/systemd/boot-check.sh\nStandardOutput=journal+console\n"
    );
    std::fs::write(dir.join("etc/systemd/system/edge-check.service"), unit).unwrap();
}

#[test]
fn the_units_run_under_systemd_as_pid_1() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        e2e::skip_or_fail(&format!("{NAME}: booting a container needs root"));
        return;
    }
    if !e2e::have_tool("systemd-nspawn") || !Path::new("/usr/lib/systemd/systemd").exists() {
        e2e::skip_or_fail(&format!("{NAME}: systemd-nspawn not found (apt-get install systemd-container)"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("edge-boot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("root");
    container_root(&root);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let model = e2e::default_model();
    let bins = repo().join("target/release");
    for bin in ["cache-service", "engine-service", "gateway"] {
        assert!(bins.join(bin).exists(), "{} missing: cargo build --release --bins", bins.join(bin).display());
    }
    let console = std::fs::File::create(out.join("console.log")).unwrap();
    let mut child = Command::new("systemd-nspawn")
        .arg("--quiet")
        .arg(format!("--directory={}", root.display()))
        .arg(format!("--machine=edge-boot-{}", std::process::id()))
        // No machined on a host whose PID 1 is not systemd; the container is this process's.
        .args(["--register=no", "--keep-unit", "--private-network", "--bind-ro=/usr"])
        .arg(format!("--bind-ro={}:/srv/edge", repo().display()))
        .arg(format!("--bind-ro={}:/srv/model/{}", model.display(), model.file_name().unwrap().to_string_lossy()))
        .arg(format!("--bind={}:/out", out.display()))
        .args(["--boot", "systemd.unit=edge-check.service"])
        .stdin(Stdio::null())
        .stdout(console.try_clone().unwrap())
        .stderr(console)
        .spawn()
        .expect("run systemd-nspawn");
    let deadline = Instant::now() + Duration::from_secs(900);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the container did not power off within 900 s; see {}", out.display());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let checks = read("check.log");
    eprintln!("{checks}");
    let tail =
        |text: String| text.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    assert!(
        checks.lines().last() == Some("PASS"),
        "the checks under systemd failed (nspawn: {status}):\n{checks}\n--- install.log\n{}\n--- journal\n{}\n--- console\n{}",
        tail(read("install.log")),
        tail(read("journal.txt")),
        tail(read("console.log")),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
