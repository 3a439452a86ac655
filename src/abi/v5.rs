//! ABI v5 (NCCL 2.28): a `u64` type and the API-level events (GroupApi, CollApi, P2pApi,
//! KernelLaunch); Coll/P2p `parentObj` is the CollApi/P2pApi handle. CollApi is read for
//! Broadcasts that NCCL runs without task events ([`super::Abi::api_broadcasts`]).

use super::{api_family, coll_api};
use crate::bindings::{ncclProfilerEventDescr_v5_t, ncclProfilerEventStateArgs_v5_t};

api_family!(5, ncclProfilerEventDescr_v5_t, ncclProfilerEventStateArgs_v5_t, {
    coll_api!();
});
