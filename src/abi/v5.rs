//! ABI v5 (NCCL 2.28): a `u64` type and the API-level events (GroupApi, CollApi, P2pApi,
//! KernelLaunch), which are declined; Coll/P2p `parentObj` is the CollApi/P2pApi handle.

use super::api_family;
use crate::bindings::{ncclProfilerEventDescr_v5_t, ncclProfilerEventStateArgs_v5_t};

api_family!(ncclProfilerEventDescr_v5_t, ncclProfilerEventStateArgs_v5_t);
