//! ABI v2 (NCCL 2.24, 2.25): names as strings; one ProxyStep per network transfer; receive
//! steps that may never stop (not used here, spec 8.3).

use super::legacy::legacy_family;
use crate::bindings::ncclProfilerEventDescr_v2_t;

legacy_family!(2, ncclProfilerEventDescr_v2_t);
