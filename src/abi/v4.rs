//! ABI v4 (NCCL 2.27, and newer NCCL through its v4 adapter): `type` is a `u8`; Coll/P2p
//! `parentObj` is the Group handle. Under NCCL ≥ 2.28 the adapter does not zero the descriptor
//! and leaves `p2p.nChannels` unset (spec 4.8), a field the reader never reads.

use super::api_family;
use crate::bindings::{ncclProfilerEventDescr_v4_t, ncclProfilerEventStateArgs_v4_t};

api_family!(4, ncclProfilerEventDescr_v4_t, ncclProfilerEventStateArgs_v4_t);
