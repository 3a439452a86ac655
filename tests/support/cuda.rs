//! The CUDA driver's stand-in (`examples/cuda_stub`): a library whose soname is `libcuda.so.1`,
//! built once per test process by a nested cargo (`shipped::cargo_build`, in a target directory of
//! its own under the tests' temporary directory) and loaded by path as the CUDA runtime loads the
//! driver (`RTLD_NOW | RTLD_LOCAL`), never unloaded ([`Driver::open`]: one built by another
//! process, as the culprit job's host processes load their parent's). The plugin then finds it as
//! it finds the driver, with `dlopen("libcuda.so.1", RTLD_NOLOAD)`. [`Driver::set_device`] makes a device current on
//! the calling thread; [`uuid`] and [`pci_bus_id`] are what DCGM calls that device.
//! Called on: test threads; the build and load run once, under a `OnceLock`.
#![allow(dead_code)]

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::shipped::cargo_build;
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// The loaded stand-in.
pub struct Driver {
    set_device: unsafe extern "C" fn(c_int),
    _library: Library,
}

impl Driver {
    /// Builds and loads the stand-in once per process; fails the calling test when it cannot.
    pub fn load() -> &'static Driver {
        Driver::open(build())
    }

    /// Loads the stand-in built at `path` ([`build`], in another process) once per process.
    pub fn open(path: &Path) -> &'static Driver {
        static DRIVER: OnceLock<Driver> = OnceLock::new();
        DRIVER.get_or_init(|| {
            // SAFETY: the stand-in has no initialisers beyond Rust's own.
            let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // SAFETY: `cudaStubSetDevice` is `extern "C" fn(c_int)` (examples/cuda_stub), and the
            // library stays loaded with this value (kept in a static).
            let set_device = unsafe { library.get::<unsafe extern "C" fn(c_int)>(b"cudaStubSetDevice\0") }
                .map(|symbol| *symbol)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Driver {
                set_device,
                _library: library,
            }
        })
    }

    /// Makes `device` current on the calling thread, as `cudaSetDevice` does; `None`: no
    /// context is current.
    pub fn set_device(&self, device: Option<u8>) {
        // SAFETY: any value is allowed; the stand-in stores it per thread.
        unsafe { (self.set_device)(device.map_or(-1, c_int::from)) };
    }
}

/// DCGM's `UUID` of the stand-in's `device`.
pub fn uuid(device: u8) -> String {
    format!("GPU-c0da5e1f-00{device:02x}-4000-8000-0000000000{device:02x}")
}

/// DCGM's `pci_bus_id` of the stand-in's `device`.
pub fn pci_bus_id(device: u8) -> String {
    format!("00000000:{:02X}:00.0", 0x3b + device)
}

/// `cargo build -p cuda-stub` into `<tests' temporary directory>/cuda_stub`, once per process;
/// the library's path.
pub fn build() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda_stub");
        cargo_build("the CUDA driver's stand-in", &["-p", "cuda-stub"], &target_dir);
        let path = target_dir.join("debug").join("libcuda_stub.so");
        assert!(path.exists(), "cargo built no {}", path.display());
        path
    })
}
