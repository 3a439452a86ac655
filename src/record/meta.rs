//! Vocabulary every layer shares: a communicator's metadata as `init` saw it, and the names of
//! the kernel phases. Written once by `init` (NCCL's init thread), read by the hot path's
//! checks, the telemetry thread and export.
#![forbid(unsafe_code)]

/// Communicator metadata, as `init` saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct CommMeta {
    /// NCCL's communicator hash.
    pub hash: u64,
    /// Communicator name (`commName`), possibly empty.
    pub name: String,
    /// Our rank in the communicator.
    pub rank: i32,
    /// Number of ranks.
    pub nranks: i32,
    /// Number of nodes.
    pub nnodes: i32,
    /// The GPU the communicator runs on, as far as the CUDA driver told.
    pub gpu: Gpu,
}

/// A GPU's identity in DCGM's formats, each `None` when the CUDA driver could not tell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gpu {
    /// `GPU-` and the 16 bytes of the UUID as lowercase hex groups 8-4-4-4-12 (DCGM's `UUID`).
    pub uuid: Option<String>,
    /// `domain:bus:device.function`, uppercase hex with an 8-digit domain (DCGM's `pci_bus_id`).
    pub pci_bus_id: Option<String>,
}

/// Kernel phases (v7), by phase: 0 initial sync (waiting for peers), 1 compute, 2 final sync.
pub const PHASES: [&str; 3] = ["initial_sync", "compute", "final_sync"];
