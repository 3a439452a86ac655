//! ABI v1 (NCCL 2.23): function, datatype, algorithm and protocol as numeric codes; one
//! ProxyStep per NCCL step; SendTransmitted reports the total before its transfer (spec 8.2).

use super::legacy::legacy_family;
use crate::bindings::ncclProfilerEventDescr_v1_t;

legacy_family!(1, ncclProfilerEventDescr_v1_t);
