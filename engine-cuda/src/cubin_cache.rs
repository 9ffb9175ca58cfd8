//! Compiled kernels on disk, so an engine restart loads cubins instead of compiling again
//! (NVRTC takes seconds for the whole set). A file is named by the kernel, the architecture
//! and a hash of everything that changes the output: the full source, the options and the
//! NVRTC version. Writes go to a temporary file renamed into place, so a reader never sees a
//! partial cubin; a file that cannot be read is compiled again.

use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use crate::CudaError;

/// The environment variable that overrides the cache directory.
pub const CACHE_DIR_VAR: &str = "EDGE_CUDA_CACHE_DIR";

/// `EDGE_CUDA_CACHE_DIR`, else `$XDG_CACHE_HOME/edge-llm/cubins`, else
/// `~/.cache/edge-llm/cubins`; `None` when none of them is set.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(CACHE_DIR_VAR) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("edge-llm/cubins"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/edge-llm/cubins"))
}

/// The file name of a compiled kernel.
pub fn file_name(kernel: &str, target: &str, source: &str, options: &[String], nvrtc: (i32, i32)) -> String {
    let mut keyed = String::with_capacity(source.len() + 256);
    keyed.push_str(source);
    for o in options {
        keyed.push('\0');
        keyed.push_str(o);
    }
    keyed.push_str(&format!("\0nvrtc {}.{}", nvrtc.0, nvrtc.1));
    format!("{kernel}-{target}-{:016x}.cubin", xxh3_64(keyed.as_bytes()))
}

/// A directory of cubins.
#[derive(Clone, Debug)]
pub struct CubinCache {
    dir: PathBuf,
}

impl CubinCache {
    pub fn new(dir: impl Into<PathBuf>) -> CubinCache {
        CubinCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cached image, if there is a readable, non-empty one.
    pub fn get(&self, name: &str) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join(name)).ok().filter(|b| !b.is_empty())
    }

    /// Stores an image (atomically: temporary file, then rename).
    pub fn put(&self, name: &str, image: &[u8]) -> Result<(), CudaError> {
        let err = |e: std::io::Error| CudaError::Cache { path: self.dir.display().to_string(), problem: e.to_string() };
        std::fs::create_dir_all(&self.dir).map_err(err)?;
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, image).map_err(err)?;
        std::fs::rename(&tmp, self.dir.join(name)).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_change_with_everything_that_changes_the_cubin() {
        let opts = vec!["--gpu-architecture=sm_90a".to_string()];
        let base = file_name("gemv", "sm_90a", "src", &opts, (13, 0));
        assert!(base.starts_with("gemv-sm_90a-") && base.ends_with(".cubin"));
        assert_eq!(base, file_name("gemv", "sm_90a", "src", &opts, (13, 0)));
        assert_ne!(base, file_name("gemv", "sm_90a", "src2", &opts, (13, 0)));
        assert_ne!(base, file_name("gemv", "sm_90a", "src", &["--fmad=false".to_string()], (13, 0)));
        assert_ne!(base, file_name("gemv", "sm_90a", "src", &opts, (13, 1)));
    }

    #[test]
    fn round_trips_and_ignores_empty_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CubinCache::new(dir.path().join("cubins"));
        assert_eq!(cache.get("a.cubin"), None);
        cache.put("a.cubin", b"\x7fELF...").unwrap();
        assert_eq!(cache.get("a.cubin").as_deref(), Some(&b"\x7fELF..."[..]));
        std::fs::write(dir.path().join("cubins/b.cubin"), b"").unwrap();
        assert_eq!(cache.get("b.cubin"), None);
    }
}
