//! ABI v6 (NCCL 2.29–2.30 natively, 2.31 through its v6 adapter): v5 plus the copy-engine
//! events; its state arguments are v5's type.

use super::api_family;
use crate::bindings::ncclProfilerEventDescr_v6_t;

api_family!(ncclProfilerEventDescr_v6_t {});
