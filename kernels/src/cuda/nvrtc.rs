//! Compiling the kernel sources with NVRTC, and the on-disk cache of compiled images.
//!
//! The CUDA backend compiles every `.cu` file at start-up for the device's exact architecture
//! (`sm_XY`, giving a cubin the driver loads without a JIT step). The test suite compiles the
//! same sources to PTX for `compute_80` and `compute_90` on machines without a GPU. Compiled
//! images are cached on disk under a key made of the source, the headers, the options and the
//! target, so a restart does not recompile, and a host without NVRTC can still start from a
//! warm cache.
//!
//! We call NVRTC's C API (through cudarc's dynamically loaded bindings) rather than cudarc's
//! `compile_ptx`, to hand our headers to NVRTC in memory and to get cubins.

use std::ffi::{c_char, c_int, CStr, CString};
use std::fs;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys;

use super::libs::{self, PreloadedLib};
use super::sources::{KernelSource, HEADERS};
use crate::backend::{KernelError, Result};

/// A compute capability, e.g. 8.0 or 9.0, or its architecture-specific variant (9.0a: wgmma),
/// whose images run on that exact architecture only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
    pub specific: bool,
}

impl Arch {
    pub const fn new(major: u32, minor: u32) -> Self {
        Arch { major, minor, specific: false }
    }
    /// The architecture-specific variant (`sm_90a`).
    pub const fn specific(major: u32, minor: u32) -> Self {
        Arch { major, minor, specific: true }
    }
    /// The number NVRTC uses, e.g. 80.
    pub fn number(&self) -> u32 {
        self.major * 10 + self.minor
    }
    /// The name in a target, e.g. `80` or `90a`.
    pub fn name(&self) -> String {
        format!("{}{}", self.number(), if self.specific { "a" } else { "" })
    }
}

/// What to compile to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// PTX for a virtual architecture (`compute_XY`): portable to later GPUs through the JIT.
    Ptx(Arch),
    /// A cubin for a real architecture (`sm_XY`): loads without JIT, runs on that family only.
    Cubin(Arch),
}

impl Target {
    pub fn arch_option(&self) -> String {
        match self {
            Target::Ptx(a) => format!("--gpu-architecture=compute_{}", a.name()),
            Target::Cubin(a) => format!("--gpu-architecture=sm_{}", a.name()),
        }
    }
    fn extension(&self) -> &'static str {
        match self {
            Target::Ptx(_) => "ptx",
            Target::Cubin(_) => "cubin",
        }
    }
}

/// A compiled translation unit.
#[derive(Debug, Clone)]
pub struct CompiledImage {
    pub file: &'static str,
    pub target: Target,
    /// PTX text (without the trailing NUL) or cubin bytes.
    pub bytes: Vec<u8>,
    /// NVRTC's log (warnings; with `--ptxas-options=-v`, registers and spills). Empty when
    /// the image came from the cache.
    pub log: String,
}

impl CompiledImage {
    /// The PTX text, for a [`Target::Ptx`] image.
    pub fn ptx(&self) -> Option<&str> {
        match self.target {
            Target::Ptx(_) => std::str::from_utf8(&self.bytes).ok(),
            Target::Cubin(_) => None,
        }
    }
}

/// Options every kernel is compiled with. Precise division and square root (the defaults) and
/// FMA contraction: the CPU twins replay the same operations.
fn base_options() -> Vec<String> {
    vec!["--std=c++17".into()]
}

/// A loaded NVRTC.
#[derive(Debug)]
pub struct NvrtcCompiler {
    include_dirs: Vec<PathBuf>,
    version: (i32, i32),
    _preloaded: Option<PreloadedLib>,
}

impl NvrtcCompiler {
    /// Loads NVRTC: from the first of `lib_dirs` holding one, else from the system's library
    /// path. `include_dirs` are passed as `--include-path` (the kernels need no CUDA header, but
    /// the folders are honoured for anything that does).
    pub fn new(lib_dirs: &[PathBuf], include_dirs: Vec<PathBuf>) -> Result<Self> {
        let preloaded = libs::preload_nvrtc(lib_dirs)?;
        if !libs::nvrtc_present() {
            let searched: Vec<String> = lib_dirs.iter().map(|d| d.display().to_string()).collect();
            return Err(KernelError::Device(format!(
                "NVRTC (libnvrtc.so.12) not found in [{}] nor on the library path; run `scripts/fetch-assets nvrtc` \
                 or install the CUDA toolkit",
                searched.join(", ")
            )));
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC is present (probed above); the out-pointers are valid.
        nvrtc_check(unsafe { sys::nvrtcVersion(&mut major, &mut minor) }, "nvrtcVersion")?;
        Ok(NvrtcCompiler { include_dirs, version: (major, minor), _preloaded: preloaded })
    }

    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Where NVRTC was loaded from, when it came from one of our folders.
    pub fn preloaded_from(&self) -> Option<&Path> {
        self._preloaded.as_ref().map(|p| p.path.as_path())
    }

    /// The real architectures this NVRTC can compile for (e.g. 50..=121).
    pub fn supported_archs(&self) -> Result<Vec<u32>> {
        let mut n: c_int = 0;
        // SAFETY: NVRTC is loaded; the buffer has the size NVRTC reported.
        nvrtc_check(unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }, "nvrtcGetNumSupportedArchs")?;
        let mut archs = vec![0 as c_int; n.max(0) as usize];
        nvrtc_check(unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }, "nvrtcGetSupportedArchs")?;
        Ok(archs.into_iter().map(|a| a as u32).collect())
    }

    /// The full option list for a target (part of the cache key).
    pub fn options(&self, target: Target) -> Vec<String> {
        options_for(target, &self.include_dirs)
    }

    /// Compiles one source. On failure the error carries NVRTC's log.
    pub fn compile(&self, src: &KernelSource, target: Target) -> Result<CompiledImage> {
        let options = self.options(target);
        let (bytes, log) = self.compile_text(src.file, src.source, &options, target)?;
        Ok(CompiledImage { file: src.file, target, bytes, log })
    }

    /// Compiles source text named `name` with explicit options (which must include the
    /// architecture of `target`); returns the image and NVRTC's log.
    pub fn compile_text(
        &self,
        name: &str,
        source: &str,
        options: &[String],
        target: Target,
    ) -> Result<(Vec<u8>, String)> {
        let cstr = |s: &str, what: &str| {
            CString::new(s).map_err(|_| KernelError::Device(format!("{what} contains a NUL byte")))
        };
        let c_src = cstr(source, name)?;
        let c_name = cstr(name, "program name")?;
        let header_src: Vec<CString> = HEADERS.iter().map(|(_, text)| cstr(text, "header")).collect::<Result<_>>()?;
        let header_names: Vec<CString> = HEADERS.iter().map(|(n, _)| cstr(n, "header name")).collect::<Result<_>>()?;
        let header_src_ptrs: Vec<*const c_char> = header_src.iter().map(|s| s.as_ptr()).collect();
        let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
        let c_opts: Vec<CString> = options.iter().map(|o| cstr(o, "option")).collect::<Result<_>>()?;
        let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();

        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer refers to a live NUL-terminated string owned above; the counts
        // match the arrays.
        nvrtc_check(
            unsafe {
                sys::nvrtcCreateProgram(
                    &mut prog,
                    c_src.as_ptr(),
                    c_name.as_ptr(),
                    header_src_ptrs.len() as c_int,
                    header_src_ptrs.as_ptr(),
                    header_name_ptrs.as_ptr(),
                )
            },
            "nvrtcCreateProgram",
        )?;
        let program = Program(prog);
        // SAFETY: the program is live; options as above.
        let status = unsafe { sys::nvrtcCompileProgram(program.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        if status != sys::nvrtcResult::NVRTC_SUCCESS {
            let log = program.log().unwrap_or_else(|e| format!("(no log: {e})"));
            return Err(KernelError::Device(format!(
                "NVRTC {}.{} failed to compile {name} ({status:?}, options {options:?}):\n{log}",
                self.version.0, self.version.1
            )));
        }
        let log = program.log().unwrap_or_default();
        let bytes = match target {
            Target::Ptx(_) => {
                let mut size = 0usize;
                // SAFETY: the program compiled; the buffer has the size NVRTC reported.
                nvrtc_check(unsafe { sys::nvrtcGetPTXSize(program.0, &mut size) }, "nvrtcGetPTXSize")?;
                let mut buf = vec![0u8; size];
                nvrtc_check(unsafe { sys::nvrtcGetPTX(program.0, buf.as_mut_ptr() as *mut c_char) }, "nvrtcGetPTX")?;
                while buf.last() == Some(&0) {
                    buf.pop();
                }
                buf
            }
            Target::Cubin(_) => {
                let mut size = 0usize;
                // SAFETY: as above.
                nvrtc_check(unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }, "nvrtcGetCUBINSize")?;
                let mut buf = vec![0u8; size];
                nvrtc_check(
                    unsafe { sys::nvrtcGetCUBIN(program.0, buf.as_mut_ptr() as *mut c_char) },
                    "nvrtcGetCUBIN",
                )?;
                buf
            }
        };
        Ok((bytes, log))
    }
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Program {
    fn log(&self) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: the program is live; the buffer has the size NVRTC reported.
        nvrtc_check(unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) }, "nvrtcGetProgramLogSize")?;
        let mut buf = vec![0u8; size.max(1)];
        nvrtc_check(unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut c_char) }, "nvrtcGetProgramLog")?;
        Ok(CStr::from_bytes_until_nul(&buf).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed once.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn nvrtc_check(status: sys::nvrtcResult, call: &str) -> Result<()> {
    if status == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(KernelError::Device(format!("{call} failed: {status:?}")))
    }
}

/// 64-bit FNV-1a: a stable hash (std's hasher may change between Rust releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The cache key of a compiled image: the source, every header, the options and the target.
/// Options include the architecture, so sm_80 and sm_90 images never collide.
pub fn cache_key(src: &KernelSource, options: &[String]) -> u64 {
    let mut parts: Vec<&[u8]> = vec![src.file.as_bytes(), src.source.as_bytes()];
    for (name, text) in HEADERS {
        parts.push(name.as_bytes());
        parts.push(text.as_bytes());
    }
    for o in options {
        parts.push(o.as_bytes());
    }
    fnv1a(&parts)
}

/// Compiled images on disk: `<dir>/<file stem>-<target>-<key>.{ptx,cubin}`.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        KernelCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, src: &KernelSource, target: Target, key: u64) -> PathBuf {
        let stem = src.file.trim_end_matches(".cu");
        let arch = match target {
            Target::Ptx(a) => format!("compute_{}", a.name()),
            Target::Cubin(a) => format!("sm_{}", a.name()),
        };
        self.dir.join(format!("{stem}-{arch}-{key:016x}.{}", target.extension()))
    }

    pub fn get(&self, src: &KernelSource, target: Target, key: u64) -> Option<CompiledImage> {
        let bytes = fs::read(self.path(src, target, key)).ok()?;
        (!bytes.is_empty()).then_some(CompiledImage { file: src.file, target, bytes, log: String::new() })
    }

    /// Stores an image (write to a temporary name, then rename: readers never see a partial file).
    pub fn put(&self, src: &KernelSource, key: u64, image: &CompiledImage) -> Result<()> {
        let io = |e: std::io::Error| KernelError::Device(format!("kernel cache {}: {e}", self.dir.display()));
        fs::create_dir_all(&self.dir).map_err(io)?;
        let path = self.path(src, image.target, key);
        // Unique per process and thread: concurrent starts never share a temporary file.
        let tmp = path.with_extension(
            format!("tmp-{}-{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""),
        );
        fs::write(&tmp, &image.bytes).map_err(io)?;
        fs::rename(&tmp, &path).map_err(io)
    }
}

/// The options a source is compiled with for `target`; also what a cache lookup without NVRTC
/// (a warm cache on a host that lacks it) keys on.
pub fn options_for(target: Target, include_dirs: &[PathBuf]) -> Vec<String> {
    let mut opts = base_options();
    opts.push(target.arch_option());
    for d in include_dirs {
        opts.push(format!("--include-path={}", d.display()));
    }
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_differ_by_target_and_source() {
        let a = super::super::sources::RMSNORM;
        let b = super::super::sources::ROPE;
        let o80 = options_for(Target::Ptx(Arch::new(8, 0)), &[]);
        let o90 = options_for(Target::Ptx(Arch::new(9, 0)), &[]);
        assert_ne!(cache_key(&a, &o80), cache_key(&a, &o90));
        assert_ne!(cache_key(&a, &o80), cache_key(&b, &o80));
        assert_eq!(cache_key(&a, &o80), cache_key(&a, &o80));
    }

    #[test]
    fn cache_round_trip() {
        let dir = std::env::temp_dir().join(format!("sieve-kcache-{}", std::process::id()));
        let cache = KernelCache::new(&dir);
        let src = super::super::sources::SCORE_HEAD;
        let target = Target::Ptx(Arch::new(8, 0));
        let key = cache_key(&src, &options_for(target, &[]));
        assert!(cache.get(&src, target, key).is_none());
        let img = CompiledImage { file: src.file, target, bytes: b".version 8.0".to_vec(), log: String::new() };
        cache.put(&src, key, &img).unwrap();
        assert_eq!(cache.get(&src, target, key).unwrap().bytes, img.bytes);
        assert!(cache.get(&src, target, key ^ 1).is_none());
        fs::remove_dir_all(&dir).ok();
    }
}
