//! How the services reach each other: Unix domain sockets in a private runtime directory by
//! default, loopback or network TCP as an option, and a shared-secret token that a server can
//! require on every call.
//!
//! A socket in a 0700 directory is reachable by its owner only (and root): other local users
//! cannot call `Generate` around the gateway's API keys, or `Commit` into the cache. TCP is
//! reachable by every local user, so a TCP listener should be paired with a token
//! ([`AuthToken`]); the services warn when one is not.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tonic::transport::{Channel, Endpoint, Uri};

/// Longest socket path the kernel accepts (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH_BYTES: usize = 107;

/// The metadata key the token travels under.
const AUTH_HEADER: &str = "authorization";

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("invalid address `{0}`: {1}")]
    InvalidAddress(String, String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The socket's directory can be entered by other users, or is not ours.
    #[error("{0}")]
    NotPrivate(String),
    #[error("{0} is in use by a running server")]
    InUse(PathBuf),
    #[error("auth token: {0}")]
    Token(String),
}

impl TransportError {
    fn io(context: impl Into<String>, source: std::io::Error) -> TransportError {
        TransportError::Io { context: context.into(), source }
    }
}

/// Where a gRPC server listens: `host:port` or `unix:/path/to.sock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = TransportError;

    fn from_str(s: &str) -> Result<ListenAddr, TransportError> {
        let invalid = |why: &str| TransportError::InvalidAddress(s.to_owned(), why.to_owned());
        if let Some(path) = s.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(invalid("unix: needs a path"));
            }
            if path.len() > MAX_SOCKET_PATH_BYTES {
                return Err(invalid("a socket path may have at most 107 bytes"));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        s.parse().map(ListenAddr::Tcp).map_err(|_| invalid("neither host:port nor unix:/path"))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// The directory the sockets live in by default: `$EDGE_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/edge` (systemd's per-user 0700 directory), else `/tmp/edge-<uid>`.
/// All three services compute the same answer, so they find each other without flags.
pub fn runtime_dir() -> PathBuf {
    let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = from_env("EDGE_RUNTIME_DIR") {
        return dir;
    }
    if let Some(dir) = from_env("XDG_RUNTIME_DIR") {
        return dir.join("edge");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    PathBuf::from(format!("/tmp/edge-{}", unsafe { libc::geteuid() }))
}

/// The default endpoint of a service's socket, `unix:<runtime dir>/<file>`.
pub fn default_socket(file: &str) -> String {
    format!("unix:{}", runtime_dir().join(file).display())
}

/// Creates `dir` (mode 0700) if it is missing; refuses one that another user owns or that
/// group or others may enter, since anyone who can enter it can connect to the sockets.
pub fn ensure_private_dir(dir: &Path) -> Result<(), TransportError> {
    if !dir.exists() {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| TransportError::io(format!("creating {}", parent.display()), e))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            // Another service of the stack made it first.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(TransportError::io(format!("creating {}", dir.display()), e)),
        }
    }
    let meta =
        std::fs::symlink_metadata(dir).map_err(|e| TransportError::io(format!("reading {}", dir.display()), e))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if !meta.is_dir() {
        return Err(TransportError::NotPrivate(format!("{} is not a directory", dir.display())));
    }
    if meta.uid() != uid {
        return Err(TransportError::NotPrivate(format!(
            "{} belongs to uid {}, not to this service's uid {uid}; pick another runtime directory",
            dir.display(),
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TransportError::NotPrivate(format!(
            "{} has mode {mode:04o}: other users could reach the sockets in it; make it 0700 (chmod 700) or pick another directory",
            dir.display()
        )));
    }
    Ok(())
}

/// The private directory a Unix socket at `path` goes into (see [`ensure_private_dir`]).
fn prepare_socket_dir(path: &Path) -> Result<(), TransportError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    ensure_private_dir(dir)
}

/// A bound listening socket.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    /// Removes its socket file when dropped.
    Unix {
        listener: UnixListener,
        path: SocketFile,
    },
}

/// A socket file that is removed when the server that bound it ends, with the server's pid
/// beside it in `<socket>.pid` (what `deploy/swap-engine.sh` and operators signal). Both are
/// removed only while the path is still this server's socket (same inode): after a takeover
/// (see [`Listener::bind_for_takeover`]) they belong to the successor.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// (device, inode) of the socket this server bound.
    id: (u64, u64),
}

/// See [`Listener::ownership`].
#[derive(Debug, Clone)]
pub struct SocketOwnership(Option<(PathBuf, (u64, u64))>);

impl SocketOwnership {
    pub fn still_ours(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match &self.0 {
            None => true,
            Some((path, id)) => std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == *id),
        }
    }
}

impl SocketFile {
    fn new(path: PathBuf) -> std::io::Result<SocketFile> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(&path)?;
        Ok(SocketFile { path, id: (meta.dev(), meta.ino()) })
    }

    fn is_ours(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id)
    }

    /// `<socket>.pid`.
    pub fn pid_path(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".pid");
        PathBuf::from(name)
    }

    fn write_pid(&self) -> std::io::Result<()> {
        let pid_path = self.pid_path();
        let tmp = pid_path.with_extension(format!("pid.{}", std::process::id()));
        std::fs::write(&tmp, format!("{}\n", std::process::id()))?;
        std::fs::rename(&tmp, &pid_path)
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        // The pid file goes with the socket: after a takeover both are the successor's.
        if self.is_ours() {
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_file(self.pid_path());
        }
    }
}

impl Listener {
    /// Binds `addr`. A Unix socket goes into a private directory (made 0700 when missing,
    /// refused when others can enter it) and is made 0600; a stale socket file left by a
    /// killed server is replaced, a live one is an error.
    pub async fn bind(addr: &ListenAddr) -> Result<Listener, TransportError> {
        match addr {
            ListenAddr::Tcp(a) => {
                TcpListener::bind(a).await.map(Listener::Tcp).map_err(|e| TransportError::io(format!("binding {a}"), e))
            }
            ListenAddr::Unix(path) => {
                prepare_socket_dir(path)?;
                if std::fs::symlink_metadata(path).is_ok() {
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        return Err(TransportError::InUse(path.clone()));
                    }
                    std::fs::remove_file(path)
                        .map_err(|e| TransportError::io(format!("removing stale socket {}", path.display()), e))?;
                }
                Listener::bind_unix_at(path, path)
            }
        }
    }

    /// Binds a Unix socket beside `addr` (`<socket>.next-<pid>`) for a server that will take
    /// `addr` over from a live one once it is ready ([`Listener::take_over`]): until then
    /// clients keep reaching the old server. TCP cannot be handed over this way.
    pub async fn bind_for_takeover(addr: &ListenAddr) -> Result<Listener, TransportError> {
        let ListenAddr::Unix(path) = addr else {
            return Err(TransportError::InvalidAddress(
                addr.to_string(),
                "taking over a listener needs a unix: socket".into(),
            ));
        };
        prepare_socket_dir(path)?;
        let mut next = path.as_os_str().to_owned();
        next.push(format!(".next-{}", std::process::id()));
        let next = PathBuf::from(next);
        let _ = std::fs::remove_file(&next);
        Listener::bind_unix_at(&next, path)
    }

    /// Moves a socket bound by [`Listener::bind_for_takeover`] onto `addr` in one rename:
    /// new connections reach this server from now on, the old one keeps the ones it has.
    /// `announce` runs between the rename and the pid file: whoever waits for the pid file to
    /// name this server (deploy/swap-engine.sh, which then stops the old one) can count on
    /// what it announced, e.g. the new main pid told to systemd before the old one exits.
    pub fn take_over(&mut self, addr: &ListenAddr, announce: impl FnOnce()) -> Result<(), TransportError> {
        let (Listener::Unix { path: file, .. }, ListenAddr::Unix(target)) = (self, addr) else {
            return Err(TransportError::InvalidAddress(addr.to_string(), "not a unix: socket".into()));
        };
        std::fs::rename(&file.path, target)
            .map_err(|e| TransportError::io(format!("moving {} onto {}", file.path.display(), target.display()), e))?;
        file.path = target.clone();
        announce();
        file.write_pid().map_err(|e| TransportError::io(format!("writing {}", file.pid_path().display()), e))
    }

    /// A check, kept after the listener moves into the server, of whether this server still
    /// owns its address (always, for TCP): false once a successor took the socket over.
    pub fn ownership(&self) -> SocketOwnership {
        match self {
            Listener::Tcp(_) => SocketOwnership(None),
            Listener::Unix { path, .. } => SocketOwnership(Some((path.path.clone(), path.id))),
        }
    }

    /// Binds `at` (0600) for a server known by `name` (its pid file goes beside `name`
    /// once it serves there).
    fn bind_unix_at(at: &Path, name: &Path) -> Result<Listener, TransportError> {
        let listener =
            UnixListener::bind(at).map_err(|e| TransportError::io(format!("binding {}", at.display()), e))?;
        let file = SocketFile::new(at.to_path_buf())
            .map_err(|e| TransportError::io(format!("reading back {}", at.display()), e))?;
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| TransportError::io(format!("restricting {}", at.display()), e))?;
        if at == name {
            file.write_pid().map_err(|e| TransportError::io(format!("writing {}", file.pid_path().display()), e))?;
        }
        Ok(Listener::Unix { listener, path: file })
    }

    /// The endpoint a client dials to reach this listener.
    pub fn endpoint(&self) -> String {
        match self {
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("http://{a}"),
                Err(_) => "http://127.0.0.1:0".to_string(),
            },
            Listener::Unix { path, .. } => format!("unix:{}", path.path.display()),
        }
    }

    pub fn is_tcp(&self) -> bool {
        matches!(self, Listener::Tcp(_))
    }

    /// Logs a warning when `service` listens on TCP without a token: every local user can
    /// reach it then, around whatever guards the front door.
    pub fn warn_if_open(&self, auth: &AuthToken, service: &str) {
        if self.is_tcp() && !auth.is_set() {
            tracing::warn!(
                endpoint = %self.endpoint(),
                "{service} listens on TCP without an auth token: every local user can call it (set auth_token_file, or listen on a unix: socket)"
            );
        }
    }
}

/// A client endpoint: `unix:/path.sock`, `http(s)://host:port`, or a bare `host:port`.
#[derive(Clone, Debug)]
pub struct Dial {
    endpoint: Endpoint,
    socket: Option<PathBuf>,
}

impl Dial {
    pub fn new(endpoint: &str, connect_timeout: Duration) -> Result<Dial, TransportError> {
        let invalid = |e: &dyn std::fmt::Display| TransportError::InvalidAddress(endpoint.to_owned(), e.to_string());
        if let Some(path) = endpoint.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(invalid(&"unix: needs a path"));
            }
            // The URI is required by tonic but unused: the connector dials the socket.
            let ep = Endpoint::from_static("http://localhost").connect_timeout(connect_timeout);
            return Ok(Dial { endpoint: ep, socket: Some(PathBuf::from(path)) });
        }
        let uri = if endpoint.contains("://") { endpoint.to_owned() } else { format!("http://{endpoint}") };
        let ep =
            Endpoint::from_shared(uri).map_err(|e| invalid(&e))?.connect_timeout(connect_timeout).tcp_nodelay(true);
        Ok(Dial { endpoint: ep, socket: None })
    }

    /// A channel that connects on first use and reconnects by itself.
    pub fn lazy(self) -> Channel {
        match self.socket {
            Some(path) => self.endpoint.connect_with_connector_lazy(UnixConnector(path.into())),
            None => self.endpoint.connect_lazy(),
        }
    }

    /// A channel connected now.
    pub async fn connect(self) -> Result<Channel, tonic::transport::Error> {
        match self.socket {
            Some(path) => self.endpoint.connect_with_connector(UnixConnector(path.into())).await,
            None => self.endpoint.connect().await,
        }
    }
}

/// Dials one socket path, whatever URI tonic passes.
#[derive(Clone)]
struct UnixConnector(Arc<Path>);

impl tower::Service<Uri> for UnixConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { tokio::net::UnixStream::connect(&*path).await.map(hyper_util::rt::TokioIo::new) })
    }
}

/// The shared secret between the services, or none. A server with a token refuses calls
/// without it (`Unauthenticated`); a client with one sends it on every call. Cheap to clone.
#[derive(Clone, Default)]
pub struct AuthToken(Option<Arc<str>>);

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "AuthToken(set)" } else { "AuthToken(none)" })
    }
}

impl AuthToken {
    pub fn none() -> AuthToken {
        AuthToken(None)
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// A token given directly (tests, or a caller that read it elsewhere). Surrounding
    /// whitespace is dropped; it must be printable ASCII, at least 16 characters.
    pub fn new(token: &str) -> Result<AuthToken, TransportError> {
        let token = token.trim();
        if token.len() < 16 {
            return Err(TransportError::Token("must have at least 16 characters".into()));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TransportError::Token("must be printable ASCII without spaces".into()));
        }
        Ok(AuthToken(Some(Arc::from(token))))
    }

    /// Reads the token from `path`, which only its owner may read (like an SSH key).
    pub fn from_file(path: &Path) -> Result<AuthToken, TransportError> {
        let meta = std::fs::metadata(path).map_err(|e| TransportError::io(format!("reading {}", path.display()), e))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TransportError::Token(format!(
                "{} has mode {mode:04o}: other users could read it; make it 0600 (chmod 600)",
                path.display()
            )));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| TransportError::io(format!("reading {}", path.display()), e))?;
        AuthToken::new(&text).map_err(|e| TransportError::Token(format!("{}: {e}", path.display())))
    }

    /// `from_file` when a path is given, else no token.
    pub fn from_optional_file(path: Option<&Path>) -> Result<AuthToken, TransportError> {
        path.map_or(Ok(AuthToken::none()), AuthToken::from_file)
    }

    /// The server side: passes a request that carries the token (or any request when there
    /// is none); compares in constant time.
    #[allow(clippy::result_large_err)]
    pub fn check<T>(&self, request: tonic::Request<T>) -> Result<tonic::Request<T>, tonic::Status> {
        let Some(expected) = &self.0 else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get(AUTH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
            Ok(request)
        } else {
            Err(tonic::Status::unauthenticated("missing or wrong internal auth token"))
        }
    }
}

/// The client side: adds the token to every call.
impl tonic::service::Interceptor for AuthToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| tonic::Status::internal("the auth token is not a valid header value"))?;
            request.metadata_mut().insert(AUTH_HEADER, value);
        }
        Ok(request)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_takeover_moves_the_socket_and_the_old_server_leaves_it_alone() {
        let dir = scratch("takeover");
        let path = dir.join("engine.sock");
        let addr = ListenAddr::Unix(path.clone());
        let old = Listener::bind(&addr).await.unwrap();
        let pid_file = dir.join("engine.sock.pid");
        assert_eq!(std::fs::read_to_string(&pid_file).unwrap().trim(), std::process::id().to_string());
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let old_ino = ino(&path);
        let old_owns = old.ownership();
        let mut new = Listener::bind_for_takeover(&addr).await.unwrap();
        assert_eq!(ino(&path), old_ino, "clients reach the old server until the takeover");
        assert!(old_owns.still_ours());
        // The announcement comes after the rename and before the pid file (rewritten by a
        // rename, so a new inode) names the new server.
        let mut at_announce = None;
        new.take_over(&addr, || at_announce = Some((ino(&path), ino(&pid_file)))).unwrap();
        let (socket_then, pid_file_then) = at_announce.expect("announced");
        assert_ne!(socket_then, old_ino, "announced after the rename");
        assert_ne!(ino(&pid_file), pid_file_then, "announced before the pid file was written");
        assert!(!old_owns.still_ours(), "the old server knows its socket is gone");
        assert!(new.ownership().still_ours());
        assert_ne!(ino(&path), old_ino, "the path is the new server's socket");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "engine.sock and its pid file, no leftovers");
        // The old server ends (its drop) and must not take the new server's socket with it.
        drop(old);
        assert!(path.exists() && pid_file.exists(), "the successor's socket and pid file stay");
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok(), "the new server answers");
        drop(new);
        assert!(!path.exists() && !pid_file.exists());
        assert!(Listener::bind_for_takeover(&ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())).await.is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("transport-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn listen_addresses_parse_and_print_back() {
        for s in ["127.0.0.1:50051", "[::1]:9", "unix:/run/edge/engine.sock"] {
            assert_eq!(s.parse::<ListenAddr>().unwrap().to_string(), s);
        }
        assert_eq!("unix:///a.sock".parse::<ListenAddr>().unwrap(), ListenAddr::Unix("/a.sock".into()));
        for bad in ["unix:", "localhost", "1.2.3.4", &format!("unix:/{}", "x".repeat(120))] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_missing_runtime_dir_is_made_0700_and_an_open_one_refused() {
        let dir = scratch("dir").join("run");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        ensure_private_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        let err = ensure_private_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("0750") && err.contains("chmod 700"), "{err}");
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[tokio::test]
    async fn a_unix_listener_is_0600_replaces_a_stale_socket_and_refuses_a_live_one() {
        let dir = scratch("bind");
        let path = dir.join("s.sock");
        let addr = ListenAddr::Unix(path.clone());
        let live = Listener::bind(&addr).await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(live.endpoint(), format!("unix:{}", path.display()));
        assert!(matches!(Listener::bind(&addr).await, Err(TransportError::InUse(_))));
        // A killed server leaves its file behind; the socket no longer answers.
        let stale = std::os::unix::net::UnixListener::bind(dir.join("stale.sock")).unwrap();
        drop(stale);
        Listener::bind(&ListenAddr::Unix(dir.join("stale.sock"))).await.unwrap();
        drop(live);
        assert!(!path.exists(), "the socket file outlived its server");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tokens_are_checked_exactly() {
        let token = AuthToken::new("0123456789abcdef-secret\n").unwrap();
        let mut client = token.clone();
        let sent = tonic::service::Interceptor::call(&mut client, tonic::Request::new(())).unwrap();
        assert!(token.check(sent).is_ok());
        assert_eq!(token.check(tonic::Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
        let mut other = AuthToken::new("0123456789abcdef-secreT").unwrap();
        let wrong = tonic::service::Interceptor::call(&mut other, tonic::Request::new(())).unwrap();
        assert_eq!(token.check(wrong).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(AuthToken::none().check(tonic::Request::new(())).is_ok());
        assert!(AuthToken::new("short").is_err());
        assert!(AuthToken::new("has a space in it here").is_err());
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        let dir = scratch("token");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(AuthToken::from_file(&file).unwrap_err().to_string().contains("chmod 600"));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(AuthToken::from_file(&file).unwrap().is_set());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
