//! NCCL 2.31's profiler thread (spec 7.3.2–7.3.3): one per emulated (communicator, rank), it
//! makes the KernelCh callbacks the proxy thread made before 2.31, and the KernelPhase ones.
//!
//! The proxy thread posts each kernel channel when its work starts ([`KernelMsg::Start`]: the
//! KernelCh start, with the GPU start time) and when it finished ([`KernelMsg::Finish`]); at a
//! finish this thread delivers, in one burst, the channel's phases (when the operation's mask had
//! KernelPhase) and then KernelChStop and the stop. A phase is delivered only when the kernel
//! stamped at least one inner boundary; a missing AFTER_OPEN is BEGIN, a missing BEFORE_CLOSE is
//! END, and an interval whose boundaries are equal or zero is skipped. Phases go out even when
//! the plugin declined the KernelCh (their parent is then NULL).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::mpsc;

use super::plugin::{self, H, Plugin, ty};

/// What the proxy thread posts.
pub(crate) enum KernelMsg {
    /// The channel's work started.
    Start {
        key: u64,
        context: *mut c_void,
        parent: H,
        channel: u8,
        gpu_start: u64,
    },
    /// The channel's work finished at `gpu_stop`; `phases`: the kernel's four phase stamps
    /// (BEGIN, AFTER_OPEN, BEFORE_CLOSE, END; 0 = not stamped) when the mask had KernelPhase.
    Finish {
        key: u64,
        gpu_stop: u64,
        phases: Option<[u64; 4]>,
    },
}

// SAFETY: the context is an opaque plugin value, handed between NCCL's threads as NCCL does.
unsafe impl Send for KernelMsg {}

/// What the thread did: its callbacks, and per phase the GPU durations (ns) it delivered under
/// a KernelCh the plugin accepted.
#[derive(Default)]
pub(crate) struct PhaseTruth {
    pub callbacks: u64,
    pub phases: [Vec<u64>; 3],
}

/// Runs until the proxy thread hangs up.
pub(crate) fn run(plugin: &Plugin, rx: mpsc::Receiver<KernelMsg>) -> PhaseTruth {
    let before = plugin::calls_on_this_thread();
    let mut out = PhaseTruth::default();
    let mut open: HashMap<u64, (H, *mut c_void, u8)> = HashMap::new();
    for msg in rx {
        match msg {
            KernelMsg::Start {
                key,
                context,
                parent,
                channel,
                gpu_start,
            } => {
                let k = plugin.kernel_ch(context, parent, channel, gpu_start);
                open.insert(key, (k, context, channel));
            }
            KernelMsg::Finish { key, gpu_stop, phases } => {
                let Some((k, context, channel)) = open.remove(&key) else {
                    continue;
                };
                if let Some(b) = phases.filter(|b| b[1] != 0 || b[2] != 0) {
                    let bounds = [
                        b[0],
                        if b[1] == 0 { b[0] } else { b[1] },
                        if b[2] == 0 { b[3] } else { b[2] },
                        b[3],
                    ];
                    for (phase, pair) in bounds.windows(2).enumerate() {
                        let (start, end) = (pair[0], pair[1]);
                        if start == end || start == 0 || end == 0 {
                            continue;
                        }
                        let p = plugin.kernel_phase(context, k, channel, phase as u8, start);
                        if !p.is_null() {
                            plugin.state(p, ty::KERNEL_PHASE_STOP, end);
                            plugin.stop(p);
                        }
                        if !k.is_null() {
                            out.phases[phase].push(end - start);
                        }
                    }
                }
                if !k.is_null() {
                    plugin.state(k, ty::KERNEL_CH_STOP, gpu_stop);
                    plugin.stop(k);
                }
            }
        }
    }
    out.callbacks = plugin::calls_on_this_thread() - before;
    out
}
