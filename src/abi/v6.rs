//! ABI v6 (NCCL 2.29–2.30 natively, 2.31 through its v6 adapter): v5 plus the copy-engine
//! events, whose CeColl is read as a collective; its state arguments are v5's type.

use super::{api_family, ce_coll, coll_api};
use crate::bindings::ncclProfilerEventDescr_v6_t;

api_family!(6, ncclProfilerEventDescr_v6_t {
    coll_api!();
    ce_coll!();
});
