//! Finding the CUDA shared libraries at run time.
//!
//! cudarc loads libcuda, libnvrtc and libcublas lazily by *name* (dlopen searches the usual
//! paths and `LD_LIBRARY_PATH`) and panics when a library is missing, so every entry point of
//! the CUDA backend probes first and turns an absence into an error.
//!
//! NVRTC can also come from a folder of our own (the asset cache, filled by
//! `scripts/fetch-assets nvrtc` from NVIDIA's Python wheels). `LD_LIBRARY_PATH` cannot be changed
//! for a running process, so instead we open the library by its full path and keep that handle:
//! the dynamic loader matches later by-name opens against the SONAME of libraries already loaded
//! (`libnvrtc.so.12`, one of the names cudarc tries), so cudarc's own lookup finds our copy.
//! libnvrtc in turn finds `libnvrtc-builtins` next to itself (its RUNPATH is `$ORIGIN`).

use std::path::{Path, PathBuf};

use crate::backend::{KernelError, Result};

/// File names tried in each folder, most specific first.
const NVRTC_FILES: &[&str] = &["libnvrtc.so.12", "libnvrtc.so"];

/// A shared library opened by full path; the library stays loaded while this lives.
#[derive(Debug)]
pub struct PreloadedLib {
    pub path: PathBuf,
    _lib: libloading::Library,
}

/// Opens the first NVRTC library found in `dirs` (in order). `Ok(None)` when none of the folders
/// holds one; an error when one is there but cannot be loaded.
pub fn preload_nvrtc(dirs: &[PathBuf]) -> Result<Option<PreloadedLib>> {
    for dir in dirs {
        for name in NVRTC_FILES {
            let path = dir.join(name);
            if path.is_file() {
                return load(&path).map(Some);
            }
        }
    }
    Ok(None)
}

fn load(path: &Path) -> Result<PreloadedLib> {
    // SAFETY: loading NVRTC runs its initialisers only; it is NVIDIA's library built for this OS.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| KernelError::Device(format!("cannot load {}: {e}", path.display())))?;
    Ok(PreloadedLib { path: path.to_path_buf(), _lib: lib })
}

/// Whether cudarc can open NVRTC by name (after any preload).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen candidate names and closes them again.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether the CUDA driver library (libcuda) can be opened. It is installed with the GPU driver.
pub fn driver_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether cuBLAS can be opened.
pub fn cublas_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}
