//! Running a test in a process of its own: the plugin reads its configuration once per process,
//! so a test that configures the in-process plugin through the environment, or that must see no
//! other test's communicators, runs this test binary again with a filter that selects only
//! itself.
//!
//! - [`own_process`]: the whole test runs in a fresh process; the calling process only waits for
//!   it and reports its outcome.
//! - [`child`]: a test starts an `#[ignore]`d helper test of its module as a child process and
//!   judges what the child did (exit status, what a receiver got).
//!
//! Tests name themselves by `module_path!()` and their function name, so the filter follows a
//! module that moves between binaries. Called on: the test's own thread.
#![allow(dead_code)]

use std::process::Command;

/// Set in a process started by [`own_process`]: the name of the one test it runs.
const OWN: &str = "NCCL_TEST_OWN_PROCESS";
/// Set in a process started by [`child`].
const CHILD: &str = "NCCL_TEST_CHILD";

/// Whether this process is a [`child`] of a test (where only its helper test runs).
pub fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// In a [`child`]: the case its `var` names; `None` in any other process.
pub fn case(var: &str) -> Option<String> {
    is_child().then(|| std::env::var(var).unwrap())
}

/// The libtest name of test `name` in `module` (its `module_path!()`): the path without the
/// crate, as `--exact` expects it.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// `true` in the process that runs test `name` of `module` alone: the caller then runs its
/// body. In any other process, runs this binary again for that test only, waits for it, fails
/// if it failed (or ran nothing), and returns `false`.
pub fn own_process(module: &str, name: &str) -> bool {
    let test = test_name(module, name);
    if std::env::var(OWN).as_deref() == Ok(test.as_str()) {
        return true;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test, "--include-ignored", "--test-threads=1", "--nocapture"])
        .env(OWN, &test)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{test} in its own process: {}", out.status);
    assert!(stdout.contains("test result: ok. 1 passed"), "{test}: no such test ran");
    false
}

/// This test binary again, running only the ignored test `name` of `module`, with `var` = `case`
/// telling it which case to run.
pub fn child(module: &str, name: &str, var: &str, case: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        &test_name(module, name),
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ])
    .env(var, case)
    .env(CHILD, "1");
    cmd
}
