//! The shipped library: `libnccl_profiler_otel.so` as `cargo build --release --lib` makes it,
//! which the tests that claim to drive what NCCL loads `dlopen`.
//!
//! The cdylib that `cargo test` builds next to the test executables is not that library: the
//! tests' dev-dependency on this package turns its test seams on, and Cargo unifies features
//! across the test build. So [`shipped_library`] builds the library once per test process with a
//! nested cargo (the one running the tests), without dev-dependencies and so without test
//! features, in a target directory of its own (`<target dir>/shipped`): the library's cdylib and
//! rlib file names carry no feature hash, so a release build with the test features (`cargo test
//! --release`, `cargo bench`) would overwrite the same files in `<target dir>/release` and a later
//! nested build would find them up to date. A test executable built for an explicit `--target`
//! (the sanitizer runs) takes the instrumented library its own build made next to it instead:
//! those runs check memory and races, which the test features do not change, and an instrumented
//! build is no shipped one.
//!
//! Called on: test threads; the build runs once, under a `OnceLock`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use super::emulator::Plugin;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// The target directory this executable was built in, and the `--target` triple it was built
/// for when one was given: its path is `<target dir>/<profile>/deps/<name>`, or
/// `<target dir>/<triple>/<profile>/deps/<name>` (a triple has two dashes at least, and the
/// target directory holds Cargo's `CACHEDIR.TAG`).
fn layout() -> (PathBuf, Option<String>) {
    let exe = std::env::current_exe().expect("current_exe");
    let above_profile = exe
        .ancestors()
        .nth(3)
        .expect("tests run from <target dir>/[<triple>/]<profile>/deps");
    let parent = above_profile.parent();
    let name = above_profile.file_name().map(|n| n.to_string_lossy().into_owned());
    match (parent, name) {
        (Some(dir), Some(triple)) if triple.matches('-').count() >= 2 && dir.join("CACHEDIR.TAG").exists() => {
            (dir.to_path_buf(), Some(triple))
        }
        _ => (above_profile.to_path_buf(), None),
    }
}

/// Builds the shipped library once per process (`cargo build --release --lib` of this package)
/// and returns its path; fails the calling test with cargo's output when the build fails.
pub fn shipped_library() -> PathBuf {
    static SHIPPED: OnceLock<PathBuf> = OnceLock::new();
    SHIPPED.get_or_init(build).clone()
}

fn build() -> PathBuf {
    let (target_dir, target) = layout();
    if target.is_some() {
        let built = super::emulator::built_library().unwrap_or_else(|e| panic!("{e}"));
        eprintln!("shipped library: a sanitizer run, the instrumented {}", built.display());
        return built;
    }
    cargo_build(
        "the shipped library",
        &["--release", "--lib"],
        &target_dir.join("shipped"),
    );
    let path = target_dir
        .join("shipped")
        .join("release")
        .join("libnccl_profiler_otel.so");
    assert!(path.exists(), "cargo built no {}", path.display());
    eprintln!("shipped library: {}", path.display());
    path
}

/// `cargo build` of this workspace with `args` into `target_dir`, by the cargo running the tests;
/// fails the calling test with cargo's output when the build fails. `what` names the build.
pub fn cargo_build(what: &str, args: &[&str], target_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(MANIFEST_DIR)
        .arg("build")
        .args(args)
        .arg("--manifest-path")
        .arg(Path::new(MANIFEST_DIR).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    eprintln!("{what}: {cmd:?}");
    let t0 = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", Path::new(&cargo).display()));
    assert!(
        out.status.success(),
        "building {what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{what}: built in {:.1?}", t0.elapsed());
}

impl Plugin {
    /// The shipped library ([`shipped_library`]), loaded like NCCL loads it ([`Plugin::load`]).
    pub fn load_shipped() -> Plugin {
        let path = shipped_library();
        Plugin::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Another instance of the shipped library, with its own configuration and state: `dlopen` of
    /// a copy of its file (`dlopen` of the same file gives the instance already loaded). The copy
    /// stays while this process runs (sanitizers symbolize from it); copies of processes that
    /// have ended are removed.
    pub fn load_shipped_copy(name: &str) -> Plugin {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        remove_stale_copies(tmp);
        let dir = tmp.join(format!("shipped-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let path = dir.join("libnccl_profiler_otel.so");
        std::fs::copy(shipped_library(), &path).expect("copying the shipped library");
        Plugin::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// Removes the `shipped-<pid>-<name>` directories in `tmp` of processes that no longer run.
fn remove_stale_copies(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("shipped-")
            .and_then(|r| r.split('-').next()?.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
