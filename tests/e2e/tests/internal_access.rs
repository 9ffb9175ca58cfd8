//! The internal endpoints are closed to everyone but the services' user: by default the
//! engine and the cache-service listen on Unix sockets (0600) in a 0700 runtime directory,
//! which another local user cannot enter; over TCP, a call without the shared token is
//! refused `Unauthenticated` while the stack itself (holding the token) serves.
//! Run: `cargo build --release --bins && cargo test --release -p e2e --test internal_access -- --test-threads=1`.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use e2e::{Stack, StackOptions, chat};

/// uid/gid of `nobody` on Debian and most distributions.
const NOBODY: u32 = 65534;

/// Tries to connect to the Unix socket `path` as `uid` (None: as this process); returns
/// Python's exception name, or "connected".
fn connect_as(uid: Option<u32>, path: &Path) -> String {
    let script = "import socket, sys\n\
        s = socket.socket(socket.AF_UNIX)\n\
        try:\n    s.connect(sys.argv[1]); print('connected')\n\
        except OSError as e:\n    print(type(e).__name__)\n";
    let mut cmd = Command::new("python3");
    cmd.args(["-c", script, &path.display().to_string()]);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().expect("python3 runs");
    assert!(out.status.success(), "python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread")]
async fn another_user_cannot_reach_the_engine_or_the_cache_service() {
    let stack = Stack::start();
    let (status, v) = chat(&stack, &e2e::explain_request("sockets", 4)).await;
    assert_eq!(status, 200, "{v}");
    let dir = stack.runtime_dir();
    assert_eq!(mode(&dir), 0o700, "runtime directory {}", dir.display());
    for socket in ["engine.sock", "cache.sock"] {
        let path = dir.join(socket);
        assert_eq!(mode(&path), 0o600, "{}", path.display());
        // The owner connects: the check below can tell access from a dead socket.
        assert_eq!(connect_as(None, &path), "connected", "{socket} as the owner");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        e2e::skip_or_fail(
            "another_user_cannot_reach_the_engine_or_the_cache_service (other-user part): acting as another user needs root",
        );
        return;
    }
    for socket in ["engine.sock", "cache.sock"] {
        let outcome = connect_as(Some(NOBODY), &dir.join(socket));
        assert_eq!(outcome, "PermissionError", "{socket} as uid {NOBODY}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn over_tcp_a_call_without_the_token_is_refused() {
    let dir = std::env::temp_dir().join(format!("edge-e2e-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "e2e-shared-secret-0123456789\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ports: Vec<u16> =
        (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    let (engine, cache) = (format!("127.0.0.1:{}", ports[0]), format!("127.0.0.1:{}", ports[1]));
    let token = ["--auth-token-file".to_string(), token_file.display().to_string()];
    let with_token = |mut args: Vec<String>| {
        args.extend(token.iter().cloned());
        args
    };
    let stack = Stack::start_with(StackOptions {
        cache_args: with_token(vec!["--listen".into(), cache.clone()]),
        engine_args: with_token(vec!["--listen".into(), engine.clone(), "--cache".into(), format!("http://{cache}")]),
        gateway_args: with_token(vec!["--engine-endpoint".into(), format!("http://{engine}")]),
        ..Default::default()
    });
    // The stack holds the token: it serves.
    let body = e2e::explain_request("tokens", 4);
    let (status, v) = chat(&stack, &body).await;
    assert_eq!(status, 200, "{v}");

    let mut engine_client = proto::engine::v1::engine_client::EngineClient::connect(format!("http://{engine}"))
        .await
        .expect("the engine's port is open");
    let refused = engine_client.info(proto::engine::v1::InfoRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let generate = proto::engine::v1::GenerateRequest { prompt_token_ids: vec![1, 2, 3], ..Default::default() };
    let refused = engine_client.generate(generate).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    let mut cache_client = proto::cache::v1::cache_client::CacheClient::connect(format!("http://{cache}"))
        .await
        .expect("the cache-service's port is open");
    let refused = cache_client.stats(proto::cache::v1::StatsRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // With the token the same call passes (the refusal above is the token's doing).
    let mut with_token = tonic::Request::new(proto::cache::v1::StatsRequest::default());
    with_token.metadata_mut().insert("authorization", "Bearer e2e-shared-secret-0123456789".parse().unwrap());
    cache_client.stats(with_token).await.expect("a call with the token passes");
    drop(stack);
    std::fs::remove_dir_all(dir).ok();
}
