//! Installs the built plugin under the name NCCL looks for: `cargo install-plugin DIR`
//! (an alias of `cargo run --profile ship --example install_plugin -- DIR`: release with fat LTO
//! and one codegen unit) copies `target/ship/libnccl_profiler_otel.so` to
//! `DIR/libnccl-profiler-otel.so`, so that `NCCL_PROFILER_PLUGIN=otel` finds it when `DIR` is on
//! `LD_LIBRARY_PATH`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: cargo install-plugin DIR");
        return ExitCode::FAILURE;
    };
    // The example runs from target/<profile>/examples; cargo builds the cdylib into
    // target/<profile>/deps (and copies it to target/<profile> only on `cargo build`).
    let profile = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()));
    let candidates = profile.iter().flat_map(|p| [p.join("deps"), p.clone()]);
    let Some(built) = candidates
        .map(|dir| dir.join("libnccl_profiler_otel.so"))
        .find(|p| p.exists())
    else {
        eprintln!("libnccl_profiler_otel.so not found next to this example; run it through cargo");
        return ExitCode::FAILURE;
    };
    let dest = dir.join("libnccl-profiler-otel.so");
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(&built, &dest)) {
        Ok(_) => {
            println!("installed {}", dest.display());
            println!(
                "use it with: LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH NCCL_PROFILER_PLUGIN=otel",
                shown(&dir)
            );
            println!("or:          NCCL_PROFILER_PLUGIN={}", shown(&dest));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot install {} as {}: {e}", built.display(), dest.display());
            ExitCode::FAILURE
        }
    }
}

fn shown(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}
