//! NVRTC, the CUDA runtime compiler, loaded by this crate from a path or a name: CUDA C
//! source in, a CUBIN for one GPU architecture out.
//!
//! cudarc's own NVRTC loader looks only for names up to `libnvrtc.so.12` and panics when none
//! loads, but PyTorch's CUDA 13 wheels ship `nvidia/cu13/lib/libnvrtc.so.13` inside
//! `site-packages`, which is on no loader path. So the library is opened here: first a path
//! the caller found (the Python layer looks in the `nvidia` packages), then the usual names;
//! a missing library or symbol is an error, never a panic. A CUBIN, not PTX, is asked for:
//! PTX from an NVRTC newer than the driver does not load (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`),
//! while a CUBIN for the device's architecture does.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};

/// The names tried after a given path, newest first.
const NAMES: &[&str] = &[
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so",
    "nvrtc64_130_0.dll",
    "nvrtc64_120_0.dll",
];

/// libnvrtc in the `nvidia` pip packages of the Python environment rooted at `prefix` (a
/// venv's directory), CUDA 13's first: PyTorch's CUDA wheels depend on these packages, and
/// CUDA 13's puts the library in `site-packages/nvidia/cu13/lib/libnvrtc.so.13`. The same
/// places `graphcheck.torch` searches on its own `sys.path` (`_digest._packaged_nvrtc`);
/// `libnvrtc-builtins` is left out (NVRTC loads it itself, and it is no compiler).
pub fn in_python_env(prefix: &Path) -> Vec<PathBuf> {
    let mut site_packages = vec![prefix.join("Lib").join("site-packages")];
    if let Ok(entries) = std::fs::read_dir(prefix.join("lib")) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python") {
                site_packages.push(e.path().join("site-packages"));
            }
        }
    }
    let mut found = Vec::new();
    for sp in site_packages {
        let Ok(packages) = std::fs::read_dir(sp.join("nvidia")) else {
            continue;
        };
        for package in packages.flatten() {
            for dir in ["lib", "bin"] {
                let Ok(files) = std::fs::read_dir(package.path().join(dir)) else {
                    continue;
                };
                for f in files.flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    let nvrtc = name.starts_with("libnvrtc.so")
                        || (name.starts_with("nvrtc64_") && name.ends_with(".dll"));
                    if nvrtc && !name.contains("builtins") {
                        found.push(f.path());
                    }
                }
            }
        }
    }
    // Newest first, by file name (`libnvrtc.so.13` sorts after `libnvrtc.so.12`), not by
    // package folder (`cu13` sorts before `cuda_nvrtc`, CUDA 12's).
    found.sort_by(|a, b| b.file_name().cmp(&a.file_name()).then_with(|| b.cmp(a)));
    found
}

/// For this workspace's tests of the kernel's compile: NVRTC from `GRAPHCHECK_NVRTC`, else
/// from CI's own Python environment (`ci/venv.sh`: `GRAPHCHECK_VENV`, else
/// `$XDG_CACHE_HOME` or `~/.cache`, then `graphcheck/ci-venv`; torch's `nvidia` packages hold
/// it), else by the usual names. Where none loads: with `CI` set this panics, because CI
/// installs NVRTC and a kernel that never compiles there must not show green; elsewhere it
/// prints `skipped: <test>: <why>` to stderr and returns `None`.
#[doc(hidden)]
pub fn for_tests(test: &str) -> Option<Nvrtc> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let given = env("GRAPHCHECK_NVRTC").map(PathBuf::from);
    let venv = env("GRAPHCHECK_VENV").map(PathBuf::from).or_else(|| {
        env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|cache| cache.join("graphcheck").join("ci-venv"))
    });
    let mut candidates: Vec<PathBuf> = given.into_iter().collect();
    candidates.extend(venv.iter().flat_map(|v| in_python_env(v)));
    candidates.extend(NAMES.iter().map(PathBuf::from));
    match Nvrtc::load_first(candidates) {
        Ok(n) => Some(n),
        Err(e) => {
            let why = format!(
                "{e} (set GRAPHCHECK_NVRTC to libnvrtc's path, or run ci/install-tools.sh, \
                 which installs torch's nvidia packages into {})",
                venv.map_or("the CI environment".into(), |v| v.display().to_string())
            );
            let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
            assert!(!ci, "{test}: CI is set, and CI installs NVRTC: {why}");
            eprintln!("skipped: {test}: {why}");
            None
        }
    }
}

/// Why NVRTC could not be loaded or could not compile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvrtcError {
    /// No library could be opened.
    #[error("NVRTC (libnvrtc) could not be loaded: {tried}")]
    NotFound {
        /// What was tried, and why each failed.
        tried: String,
    },
    /// The library lacks a function.
    #[error("{path} has no {symbol}: not an NVRTC library")]
    Symbol {
        /// The library.
        path: String,
        /// The missing function.
        symbol: &'static str,
    },
    /// A call failed.
    #[error("{call} failed: {message} ({code})")]
    Call {
        /// The call.
        call: &'static str,
        /// `nvrtcResult`.
        code: i32,
        /// NVRTC's words for it.
        message: String,
    },
    /// The source did not compile.
    #[error("NVRTC {version} could not compile {name} for {arch}: {log}")]
    Compile {
        /// The program's name.
        name: String,
        /// The target, e.g. `sm_90`.
        arch: String,
        /// `major.minor` of the library.
        version: String,
        /// The compiler's log.
        log: String,
    },
}

type Program = *mut std::ffi::c_void;

/// The functions used, with their C signatures (`nvrtc.h`, stable since CUDA 11.1).
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Program) -> c_int,
}

/// A loaded NVRTC library. Kept for the life of the process once loaded (unloading a
/// compiler that a module's code came from buys nothing).
pub struct Nvrtc {
    api: Api,
    path: String,
    version: (i32, i32),
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl Nvrtc {
    /// Opens NVRTC: `path` first where given, then the usual library names.
    pub fn load(path: Option<&Path>) -> Result<Nvrtc, NvrtcError> {
        let mut candidates: Vec<PathBuf> = path.map(Path::to_path_buf).into_iter().collect();
        candidates.extend(NAMES.iter().map(PathBuf::from));
        Nvrtc::load_first(candidates)
    }

    /// Opens the first of `candidates` that loads.
    fn load_first(candidates: Vec<PathBuf>) -> Result<Nvrtc, NvrtcError> {
        let mut tried = Vec::new();
        for c in candidates {
            // SAFETY: loading runs the library's initializers; NVRTC's only set up its own
            // state (it is what cudarc and PyTorch load the same way).
            match unsafe { libloading::Library::new(&c) } {
                Ok(lib) => return Nvrtc::from_library(lib, c.display().to_string()),
                Err(e) => tried.push(format!("{}: {e}", c.display())),
            }
        }
        Err(NvrtcError::NotFound {
            tried: tried.join("; "),
        })
    }

    fn from_library(lib: libloading::Library, path: String) -> Result<Nvrtc, NvrtcError> {
        /// The symbol `name` as a function of the type the field it fills has.
        ///
        /// # Safety
        /// `F` must be the symbol's C signature.
        unsafe fn get<F: Copy>(
            lib: &libloading::Library,
            path: &str,
            name: &'static str,
        ) -> Result<F, NvrtcError> {
            let bytes = format!("{name}\0");
            // SAFETY: the caller vouches for `F`.
            unsafe { lib.get::<F>(bytes.as_bytes()) }
                .map(|s| *s)
                .map_err(|_| NvrtcError::Symbol {
                    path: path.to_string(),
                    symbol: name,
                })
        }
        // SAFETY: each type is the function's signature in nvrtc.h (nvrtcResult is an int
        // enum, nvrtcProgram a pointer).
        let api = unsafe {
            Api {
                version: get(&lib, &path, "nvrtcVersion")?,
                error_string: get(&lib, &path, "nvrtcGetErrorString")?,
                create: get(&lib, &path, "nvrtcCreateProgram")?,
                compile: get(&lib, &path, "nvrtcCompileProgram")?,
                log_size: get(&lib, &path, "nvrtcGetProgramLogSize")?,
                log: get(&lib, &path, "nvrtcGetProgramLog")?,
                cubin_size: get(&lib, &path, "nvrtcGetCUBINSize")?,
                cubin: get(&lib, &path, "nvrtcGetCUBIN")?,
                destroy: get(&lib, &path, "nvrtcDestroyProgram")?,
            }
        };
        let mut nvrtc = Nvrtc {
            api,
            path,
            version: (0, 0),
            _lib: lib,
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        let code = unsafe { (nvrtc.api.version)(&mut major, &mut minor) };
        nvrtc.check("nvrtcVersion", code)?;
        nvrtc.version = (major, minor);
        Ok(nvrtc)
    }

    /// Where the library was loaded from (the path or name that opened).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `(major, minor)` of the library.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), NvrtcError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: returns a static string for any code.
        let p = unsafe { (self.api.error_string)(code) };
        let message = if p.is_null() {
            format!("nvrtcResult {code}")
        } else {
            // SAFETY: a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(NvrtcError::Call {
            call,
            code,
            message,
        })
    }

    /// Compiles `source` (named `name` in messages) into a CUBIN for `arch` (`sm_90`), with
    /// further command-line `options` (`-DNAME=VALUE`, …).
    pub fn compile_cubin(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        options: &[String],
    ) -> Result<Vec<u8>, NvrtcError> {
        let c = |s: &str| CString::new(s.replace('\0', " ")).expect("NUL bytes replaced");
        let (src, cname) = (c(source), c(name));
        let mut opts = vec![c(&format!("--gpu-architecture={arch}"))];
        opts.extend(options.iter().map(|o| c(o)));
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings alive for the call; no headers.
        let code = unsafe {
            (self.api.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.check("nvrtcCreateProgram", code)?;
        let guard = ProgramGuard {
            api: &self.api,
            prog,
        };
        // SAFETY: a live program; the options are NUL-terminated strings alive for the call.
        let code = unsafe { (self.api.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        if code != 0 {
            let log = self.log(prog).unwrap_or_default();
            let log = if log.trim().is_empty() {
                self.check("nvrtcCompileProgram", code)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            } else {
                log
            };
            return Err(NvrtcError::Compile {
                name: name.to_string(),
                arch: arch.to_string(),
                version: format!("{}.{}", self.version.0, self.version.1),
                log: log.trim().to_string(),
            });
        }
        let mut size = 0usize;
        // SAFETY: a compiled program; writes one size.
        self.check("nvrtcGetCUBINSize", unsafe {
            (self.api.cubin_size)(prog, &mut size)
        })?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has the size NVRTC reported.
        self.check("nvrtcGetCUBIN", unsafe {
            (self.api.cubin)(prog, cubin.as_mut_ptr().cast())
        })?;
        drop(guard);
        Ok(cubin)
    }

    fn log(&self, prog: Program) -> Result<String, NvrtcError> {
        let mut size = 0usize;
        // SAFETY: a live program; writes one size.
        self.check("nvrtcGetProgramLogSize", unsafe {
            (self.api.log_size)(prog, &mut size)
        })?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` has the size NVRTC reported (NUL included).
        self.check("nvrtcGetProgramLog", unsafe {
            (self.api.log)(prog, buf.as_mut_ptr().cast())
        })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
}

/// Destroys a program when dropped.
struct ProgramGuard<'a> {
    api: &'a Api,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once.
        let _ = unsafe { (self.api.destroy)(&mut self.prog) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_naming_what_was_tried() {
        let e = Nvrtc::load_first(vec!["/nonexistent/a.so".into(), "/nonexistent/b.so".into()])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("NVRTC (libnvrtc) could not be loaded"), "{e}");
        assert!(
            e.contains("/nonexistent/a.so") && e.contains("/nonexistent/b.so"),
            "{e}"
        );
    }

    #[test]
    fn nvrtc_is_found_in_a_python_envs_nvidia_packages_newest_first() {
        let root = std::env::temp_dir().join(format!("graphcheck-nvrtc-{}", std::process::id()));
        let site = root.join("lib/python3.11/site-packages/nvidia");
        let files = [
            "cu13/lib/libnvrtc.so.13",
            "cu13/lib/libnvrtc-builtins.so.13.2",
            "cuda_nvrtc/lib/libnvrtc.so.12",
            "cublas/lib/libcublas.so.13",
        ];
        for f in files {
            let path = site.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"").unwrap();
        }
        let found = in_python_env(&root);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            found,
            [
                site.join("cu13/lib/libnvrtc.so.13"),
                site.join("cuda_nvrtc/lib/libnvrtc.so.12")
            ]
        );
        assert_eq!(in_python_env(&root), Vec::<PathBuf>::new());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_that_is_not_nvrtc_is_an_error() {
        let e = Nvrtc::load_first(vec!["libc.so.6".into()]).unwrap_err();
        assert!(
            matches!(
                e,
                NvrtcError::Symbol {
                    symbol: "nvrtcVersion",
                    ..
                }
            ),
            "{e}"
        );
    }
}
