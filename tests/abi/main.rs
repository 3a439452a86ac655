//! The NCCL profiler ABI: `layout`, every size and offset of the bindgen types against the spec
//! (x86_64 Linux only); `v7`, NCCL 2.31's ABI v7 driven through the plugin's v7 table by the
//! emulator, down to the OTLP export.

#[path = "../support"]
mod support {
    pub mod emulator;
    pub mod export;
    pub mod otlp_receiver;
    pub mod process;
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod layout;
mod v7;
