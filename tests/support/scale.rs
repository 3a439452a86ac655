//! The workload `docs/scale.md` measures, shared by `benches/scale.rs` (bytes and series per
//! variant) and the export tests' series budget (`tests/export/budget.rs`).
//!
//! One process emulates rank 0 of a 16-rank job on 2 nodes (NCCL 2.31.2) in four communicators
//! of 32 channels each: data parallel over all ranks (AllReduce of 64, 8 and 1 MiB, AllGather and
//! ReduceScatter of 4 MiB), tensor parallel within the node (AllReduce of 16 and 1 MiB), pipeline
//! (Send/Recv of 2 MiB to the next stage) and expert parallel (AlltoAll of 2 MiB per peer over all
//! ranks). Called on: the test's or the bench's main thread.
#![allow(dead_code)]

use super::emulator::release::{self, Release};
use super::emulator::{Call, CommSpec, Link, Network, Plugin, Workload};
use super::otlp_receiver::ExportMetricsServiceRequest;
use prost::Message as _;

/// Ranks of the job.
pub const RANKS: usize = 16;
/// Ranks per node.
pub const PER_NODE: usize = 8;
/// Channels of every communicator.
pub const CHANNELS: u8 = 32;

/// Runs `iterations` of the workload through `plugin` (loaded after [`release::set`]), finalizing
/// its communicators.
pub fn run(plugin: &Plugin, iterations: usize) {
    let all = || 0..RANKS;
    let comms = [
        CommSpec::new("dp", all()).calls([
            Call::all_reduce(64 << 20),
            Call::all_reduce(8 << 20),
            Call::all_reduce(1 << 20),
            Call::all_gather(4 << 20),
            Call::reduce_scatter(4 << 20),
        ]),
        CommSpec::new("tp", 0..PER_NODE).calls([Call::all_reduce(16 << 20), Call::all_reduce(1 << 20)]),
        CommSpec::new("pp", (0..RANKS).step_by(PER_NODE)).calls([Call::send_recv(1, 2 << 20)]),
        CommSpec::new("ep", all()).calls([Call::all_to_all(2 << 20)]),
    ];
    let net = Network::new(RANKS, PER_NODE, Link::new_us(20.0, 12.0));
    let mut workload = Workload::new(net).iterations(iterations);
    for c in comms {
        workload = workload.comm(c.channels(CHANNELS).emulate([0]));
    }
    workload.run(plugin);
}

/// The release the workload emulates; set before the plugin is loaded.
pub fn set_release() {
    release::set(Release::V2_31_2);
}

/// The largest of `reqs`: with cumulative temporality every export carries every series seen so
/// far, so once every operation has run it carries them all.
pub fn largest(reqs: &[ExportMetricsServiceRequest]) -> &ExportMetricsServiceRequest {
    reqs.iter().max_by_key(|r| r.encoded_len()).expect("no export arrived")
}
