//! ABI v7 as released in NCCL 2.31.2 (spec 7.2): the v6 descriptor grown to 136 bytes
//! (`userTag`, `kernelVariant`, `isSymColl`, KernelPhase), every v6 field at its v6 offset; its
//! state arguments are v5's type.

use super::api_family;
use crate::bindings::ncclProfilerEventDescr_v7_t;

api_family!(ncclProfilerEventDescr_v7_t);
