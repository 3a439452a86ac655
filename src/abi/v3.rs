//! ABI v3 (NCCL 2.26): v2 without Coll `trafficBytes`, with KernelCh (no GPU time: declined)
//! and NetPlugin (spec 8.4).

use super::legacy::legacy_family;
use crate::bindings::ncclProfilerEventDescr_v3_t;

legacy_family!(3, ncclProfilerEventDescr_v3_t);
