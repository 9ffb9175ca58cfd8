//! The shared-memory arena: one file under /dev/shm (mode 0600) that this process creates,
//! sizes and owns, and that engines map read-write. It holds bytes only; every table lives
//! in this process.
//!
//! Layout: a 4096-byte header at offset 0 (see [`Header`]), then `page_count` pages of
//! `page_stride` bytes from `PAGES_OFFSET`. The stride is the first attaching engine's
//! `page_bytes` rounded up to 4096, so every page starts page-aligned; the mapping is
//! advised `MADV_HUGEPAGE` (a no-op where tmpfs huge pages are off).
//!
//! Ownership: an exclusive `flock` on the file is held for the process's life. A file left
//! by a crashed owner (no lock) is replaced at startup; a live owner's file is an error. The
//! file is removed when the [`Arena`] drops (clean shutdown).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use crate::error::CacheError;

pub use cache_client::arena_header::{Header, MAGIC, PAGE_ALIGN, PAGES_OFFSET, VERSION};

/// How pages are laid out in the arena, decided on the first Attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub page_stride: u64,
    pub page_count: u32,
    pub page_tokens: u32,
}

/// What to create.
#[derive(Clone, Debug)]
pub struct ArenaOptions {
    pub path: PathBuf,
    pub file_bytes: u64,
    /// Allocate the whole file up front (posix_fallocate), so a full /dev/shm fails here at
    /// startup instead of as SIGBUS in an engine writing a page.
    pub reserve: bool,
}

#[derive(Debug)]
pub struct Arena {
    path: PathBuf,
    // Held for the flock; closing it would release ownership.
    _file: File,
    map: MmapMut,
    file_bytes: u64,
    geometry: Option<Geometry>,
}

fn round_up(v: u64, align: u64) -> u64 {
    v.div_ceil(align) * align
}

impl Arena {
    pub fn create(opts: &ArenaOptions) -> Result<Arena, CacheError> {
        let path = &opts.path;
        if opts.file_bytes < PAGES_OFFSET + PAGE_ALIGN {
            return Err(CacheError::InvalidArgument(format!(
                "arena_bytes {} is too small (minimum {})",
                opts.file_bytes,
                PAGES_OFFSET + PAGE_ALIGN
            )));
        }
        remove_stale(path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| CacheError::io(format!("creating arena file {}", path.display()), e))?;
        lock_exclusive(&file).map_err(|e| CacheError::io(format!("locking {}", path.display()), e))?;
        let result = Self::size_and_map(file, opts);
        if result.is_err() {
            let _ = std::fs::remove_file(path);
        }
        result
    }

    fn size_and_map(file: File, opts: &ArenaOptions) -> Result<Arena, CacheError> {
        let path = &opts.path;
        file.set_len(opts.file_bytes)
            .map_err(|e| CacheError::io(format!("sizing {} to {} bytes", path.display(), opts.file_bytes), e))?;
        if opts.reserve {
            // SAFETY: plain syscall on an open fd.
            let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, opts.file_bytes as libc::off_t) };
            if rc != 0 {
                return Err(CacheError::io(
                    format!("reserving {} bytes for {} (is /dev/shm big enough?)", opts.file_bytes, path.display()),
                    std::io::Error::from_raw_os_error(rc),
                ));
            }
        }
        // SAFETY: we own the file (exclusive lock) and never truncate it while mapped.
        let map =
            unsafe { MmapMut::map_mut(&file) }.map_err(|e| CacheError::io(format!("mapping {}", path.display()), e))?;
        advise_huge_pages(&map);
        let mut arena = Arena { path: path.clone(), _file: file, map, file_bytes: opts.file_bytes, geometry: None };
        arena.write_header(None);
        Ok(arena)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    pub fn geometry(&self) -> Option<Geometry> {
        self.geometry
    }

    /// The geometry `page_bytes`/`page_tokens` would get in this arena.
    pub fn plan(&self, page_bytes: u64, page_tokens: u32) -> Result<Geometry, CacheError> {
        let page_stride = round_up(page_bytes.max(1), PAGE_ALIGN);
        let page_count = (self.file_bytes - PAGES_OFFSET) / page_stride;
        if page_count == 0 {
            return Err(CacheError::LayoutConflict(format!(
                "the arena ({} bytes) cannot hold one page of {page_bytes} bytes",
                self.file_bytes
            )));
        }
        Ok(Geometry { page_stride, page_count: page_count.min(u64::from(u32::MAX)) as u32, page_tokens })
    }

    /// Adopts a geometry and publishes it in the header. The caller makes sure no engine is
    /// using the old one.
    pub fn format(&mut self, geometry: Geometry) {
        self.geometry = Some(geometry);
        self.write_header(Some(geometry));
    }

    fn write_header(&mut self, g: Option<Geometry>) {
        let header = Header {
            magic: MAGIC,
            version: VERSION,
            page_tokens: g.map_or(0, |g| g.page_tokens),
            page_stride: g.map_or(0, |g| g.page_stride),
            page_count: g.map_or(0, |g| g.page_count),
            pages_offset: PAGES_OFFSET,
            file_bytes: self.file_bytes,
        };
        self.map[..Header::BYTES].copy_from_slice(&header.encode());
    }

    pub fn header(&self) -> Option<Header> {
        Header::decode(&self.map)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => tracing::info!(path = %self.path.display(), "removed the arena file"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove the arena file")
            }
        }
    }
}

fn lock_exclusive(file: &File) -> std::io::Result<()> {
    // SAFETY: plain syscall on an open fd.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Removes an arena file left by a dead owner; refuses if a live process holds its lock.
fn remove_stale(path: &Path) -> Result<(), CacheError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(CacheError::io(format!("opening existing {}", path.display()), e));
        }
    };
    if lock_exclusive(&file).is_err() {
        return Err(CacheError::LayoutConflict(format!(
            "{} is in use by another cache-service (pick another --shm-name)",
            path.display()
        )));
    }
    tracing::warn!(path = %path.display(), "replacing an arena file left by a previous run");
    std::fs::remove_file(path).map_err(|e| CacheError::io(format!("removing stale {}", path.display()), e))
}

fn advise_huge_pages(map: &MmapMut) {
    // SAFETY: the range is exactly our live mapping; MADV_HUGEPAGE does not change contents.
    let rc = unsafe { libc::madvise(map.as_ptr() as *mut libc::c_void, map.len(), libc::MADV_HUGEPAGE) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "madvise(MADV_HUGEPAGE) refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(name: &str, bytes: u64) -> ArenaOptions {
        let dir = std::env::temp_dir();
        ArenaOptions {
            path: dir.join(format!("edge-cache-test-{name}-{}", std::process::id())),
            file_bytes: bytes,
            reserve: false,
        }
    }

    #[test]
    fn creates_formats_and_removes_the_file() {
        let o = opts("format", 1 << 20);
        let mut a = Arena::create(&o).unwrap();
        let meta = std::fs::metadata(&o.path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), 1 << 20);
        let g = a.plan(10_000, 16).unwrap();
        assert_eq!(g.page_stride, 12_288);
        assert_eq!(g.page_count as u64, ((1 << 20) - PAGES_OFFSET) / 12_288);
        a.format(g);
        let h = a.header().unwrap();
        assert_eq!((h.magic, h.page_stride, h.page_count, h.page_tokens), (MAGIC, 12_288, g.page_count, 16));
        drop(a);
        assert!(!o.path.exists());
    }

    #[test]
    fn a_live_owner_is_not_replaced_but_a_stale_file_is() {
        let o = opts("owner", 1 << 16);
        let a = Arena::create(&o).unwrap();
        assert!(matches!(Arena::create(&o), Err(CacheError::LayoutConflict(_))));
        drop(a);
        std::fs::write(&o.path, b"stale").unwrap();
        let b = Arena::create(&o).unwrap();
        assert_eq!(std::fs::metadata(&o.path).unwrap().len(), 1 << 16);
        drop(b);
    }

    #[test]
    fn a_page_larger_than_the_arena_is_a_conflict() {
        let a = Arena::create(&opts("small", 1 << 16)).unwrap();
        assert!(matches!(a.plan(1 << 20, 16), Err(CacheError::LayoutConflict(_))));
    }
}
