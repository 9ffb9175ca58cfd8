//! Finding NVRTC. The driver (libcuda) comes with the GPU's driver and is on the loader's
//! path; NVRTC comes with a CUDA toolkit or the PyPI wheel `nvidia-cuda-nvrtc`, often in a
//! directory the loader does not search. We look in `EDGE_CUDA_NVRTC_DIR` (':'-separated),
//! `$CUDA_HOME`/`$CUDA_PATH`, then `/usr/local/cuda`, and load what we find by its full path
//! before cudarc's first NVRTC call: cudarc opens libraries by name (and panics when none
//! loads), and the dynamic loader resolves that name to the library already loaded.

use std::path::{Path, PathBuf};

/// The environment variable naming extra NVRTC directories.
pub const NVRTC_DIR_VAR: &str = "EDGE_CUDA_NVRTC_DIR";

/// Directories searched for NVRTC, in order.
pub fn nvrtc_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os(NVRTC_DIR_VAR) {
        dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    for target in ["x86_64-linux", "sbsa-linux", "aarch64-linux"] {
        dirs.push(PathBuf::from(format!("/usr/local/cuda/targets/{target}/lib")));
    }
    dirs
}

/// NVRTC's files in `dir`: the library, and the builtins library it opens by name (the
/// wheel's copy is not on the loader's path either).
pub fn nvrtc_files(dir: &Path) -> Option<(PathBuf, Option<PathBuf>)> {
    let lib = ["libnvrtc.so.13", "libnvrtc.so"].iter().map(|n| dir.join(n)).find(|p| p.is_file())?;
    let builtins = std::fs::read_dir(dir).ok().and_then(|entries| {
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with("libnvrtc-builtins.so") && !name.contains(".alt.")
            })
            .collect();
        found.sort();
        found.pop()
    });
    Some((lib, builtins))
}

#[cfg(feature = "cuda")]
mod load {
    use std::ffi::CString;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    use super::{nvrtc_dirs, nvrtc_files};
    use crate::CudaError;

    /// The NVRTC this process uses.
    #[derive(Clone, Debug)]
    pub struct Nvrtc {
        /// `None`: found by the loader itself.
        pub dir: Option<PathBuf>,
        pub version: (i32, i32),
    }

    /// Loads NVRTC once (see the module doc); later calls return the first answer.
    pub fn nvrtc() -> Result<&'static Nvrtc, CudaError> {
        static NVRTC: OnceLock<Result<Nvrtc, CudaError>> = OnceLock::new();
        NVRTC.get_or_init(find).as_ref().map_err(Clone::clone)
    }

    fn find() -> Result<Nvrtc, CudaError> {
        let mut dir = None;
        // SAFETY: probing opens the library by name and closes it; no symbol is called.
        let present = |_: ()| unsafe { cudarc::nvrtc::sys::is_culib_present() };
        if std::env::var_os(super::NVRTC_DIR_VAR).is_some() || !present(()) {
            for d in nvrtc_dirs() {
                if let Some((lib, builtins)) = nvrtc_files(&d) {
                    if let Some(b) = builtins {
                        open_global(&b)?;
                    }
                    open_global(&lib)?;
                    dir = Some(d);
                    break;
                }
            }
        }
        if !present(()) {
            return Err(CudaError::NoNvrtc(format!(
                "libnvrtc is not on the loader's path nor in {} (set {} to the directory of \
                 libnvrtc.so.13, e.g. the `nvidia/cu13/lib` of the PyPI wheel nvidia-cuda-nvrtc)",
                nvrtc_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
                super::NVRTC_DIR_VAR
            )));
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library is present (checked above); the out-pointers are valid.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| CudaError::NoNvrtc(format!("nvrtcVersion: {e:?}")))?;
        tracing::info!(dir = ?dir, version = %format!("{major}.{minor}"), "NVRTC loaded");
        Ok(Nvrtc { dir, version: (major, minor) })
    }

    /// Opens a library by path with its symbols global, and keeps it open for the process's
    /// life (a later open by its soname finds it).
    fn open_global(path: &Path) -> Result<(), CudaError> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| CudaError::NoNvrtc(format!("{}: path has a NUL byte", path.display())))?;
        // SAFETY: dlopen with a valid C string; the handle is deliberately never closed.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a thread-local message or null.
            let why = unsafe {
                let e = libc::dlerror();
                if e.is_null() {
                    "unknown error".to_string()
                } else {
                    std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            return Err(CudaError::NoNvrtc(format!("{}: {why}", path.display())));
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
pub use load::{Nvrtc, nvrtc};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_wheel_layout() {
        let dir = tempfile::tempdir().unwrap();
        assert!(nvrtc_files(dir.path()).is_none());
        for name in
            ["libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libnvrtc-builtins.alt.so.13.0", "libnvrtc.alt.so.13"]
        {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let (lib, builtins) = nvrtc_files(dir.path()).unwrap();
        assert_eq!(lib, dir.path().join("libnvrtc.so.13"));
        assert_eq!(builtins, Some(dir.path().join("libnvrtc-builtins.so.13.0")));
    }
}
