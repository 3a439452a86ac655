//! Builds and installs the plugin under the name NCCL looks for:
//! `cargo install-plugin DIR [--features grpc,tls]` (an alias of
//! `cargo run --profile ship --example install_plugin -- …`) builds the library in the `ship`
//! profile (release with fat LTO and one codegen unit) with exactly the cargo features given, and
//! copies `target/ship/libnccl_profiler_otel.so` to `DIR/libnccl-profiler-otel.so`, so that
//! `NCCL_PROFILER_PLUGIN=otel` finds it when `DIR` is on `LD_LIBRARY_PATH`. It says which
//! features the installed library has.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo install-plugin DIR [--features grpc,tls]";

/// What to install where.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    dir: PathBuf,
    /// Cargo features, comma-separated as cargo takes them; empty: none.
    features: String,
}

/// `DIR` and `--features F` (or `--features=F`), in any order.
fn parse(args: impl IntoIterator<Item = String>) -> Result<Request, String> {
    let (mut dir, mut features) = (None, None);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let value = match arg.strip_prefix("--features") {
            Some("") => Some(args.next().ok_or("--features needs a value")?),
            Some(v) if v.starts_with('=') => Some(v[1..].to_owned()),
            _ => None,
        };
        match (value, arg.starts_with('-')) {
            (Some(v), _) if features.is_none() => features = Some(v),
            (Some(_), _) => return Err("--features given twice".into()),
            (None, true) => return Err(format!("unknown option {arg}")),
            (None, false) if dir.is_none() => dir = Some(PathBuf::from(arg)),
            (None, false) => return Err(format!("one directory only, not also {arg}")),
        }
    }
    Ok(Request {
        dir: dir.ok_or("no directory given")?,
        features: features.unwrap_or_default().replace(' ', ","),
    })
}

/// The cargo command that builds the library in the `ship` profile with `features`.
fn build_command(cargo: &str, manifest: &Path, features: &str) -> Command {
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--profile", "ship", "--lib", "--manifest-path"])
        .arg(manifest);
    if !features.is_empty() {
        cmd.args(["--features", features]);
    }
    cmd
}

fn main() -> ExitCode {
    let request = match parse(std::env::args().skip(1)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    // The example runs from target/ship/examples; `cargo build` puts the library in target/ship.
    let Some(profile) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
    else {
        eprintln!("cannot find the target directory; run this through cargo");
        return ExitCode::FAILURE;
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    match build_command(&cargo, &manifest, &request.features).status() {
        Ok(status) if status.success() => {}
        Ok(status) => {
            eprintln!("building the plugin failed ({status})");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("cannot run {cargo}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let built = profile.join("libnccl_profiler_otel.so");
    let dest = request.dir.join("libnccl-profiler-otel.so");
    if let Err(e) = std::fs::create_dir_all(&request.dir).and_then(|()| std::fs::copy(&built, &dest)) {
        eprintln!("cannot install {} as {}: {e}", built.display(), dest.display());
        return ExitCode::FAILURE;
    }
    let features = match request.features.as_str() {
        "" => "none (OTLP over HTTP, http:// only; --features grpc,tls adds gRPC and https://)",
        f => f,
    };
    println!("installed {} (profile ship, features: {features})", dest.display());
    println!(
        "use it with: LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH NCCL_PROFILER_PLUGIN=otel",
        shown(&request.dir)
    );
    println!("or:          NCCL_PROFILER_PLUGIN={}", shown(&dest));
    ExitCode::SUCCESS
}

fn shown(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn arguments() {
        let ok = |s: &str, dir: &str, features: &str| {
            let want = Request {
                dir: dir.into(),
                features: features.into(),
            };
            assert_eq!(parse(args(s)), Ok(want), "{s}");
        };
        ok("/opt/p", "/opt/p", "");
        ok("/opt/p --features grpc,tls", "/opt/p", "grpc,tls");
        ok("--features=tls /opt/p", "/opt/p", "tls");
        for bad in [
            "",
            "--features grpc",
            "/opt/p --features",
            "/opt/p /opt/q",
            "/opt/p --release",
            "/opt/p --features a --features b",
        ] {
            assert!(parse(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn builds_with_exactly_the_features_asked() {
        let manifest = Path::new("/src/Cargo.toml");
        let line = |f: &str| {
            let cmd = build_command("cargo", manifest, f);
            cmd.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(line(""), "build --profile ship --lib --manifest-path /src/Cargo.toml");
        assert_eq!(
            line("grpc,tls"),
            "build --profile ship --lib --manifest-path /src/Cargo.toml --features grpc,tls"
        );
    }
}
