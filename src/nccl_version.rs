//! Which NCCL release loaded us: `ncclGetVersion`, looked up first in the process's global scope,
//! then in the object that holds NCCL's logger (libnccl loaded `RTLD_LOCAL`, as Python extensions
//! load it). Some choices depend on it (KernelCh's cost differs by release, spec 7.3.6).
//! Called on: NCCL's init thread, never the hot path (`dlsym` and `dladdr` take the loader's lock).

use std::ffi::{CStr, c_int, c_void};
use std::fmt;

use crate::bindings::{ncclDebugLogger_t, ncclResult_t, ncclSuccess};

/// An NCCL release, `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NcclVersion {
    /// Major, 2 for every release this plugin knows.
    pub major: u32,
    /// Minor, e.g. 31 for 2.31.2.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl NcclVersion {
    /// NCCL 2.31.0, the first release whose KernelCh costs 4–13 % of GPU time (spec 7.3.6).
    pub const V2_31: NcclVersion = NcclVersion::new(2, 31, 0);

    /// A release from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        NcclVersion { major, minor, patch }
    }

    /// Decodes `NCCL_VERSION_CODE`: `major*10000 + minor*100 + patch` from 2.9 on, `major*1000 +
    /// minor*100 + patch` before. `None` for a code no release has (zero or negative).
    pub fn from_code(code: c_int) -> Option<Self> {
        let code = u32::try_from(code).ok().filter(|&c| c > 0)?;
        Some(if code >= 20900 {
            NcclVersion::new(code / 10000, code / 100 % 100, code % 100)
        } else {
            NcclVersion::new(code / 1000, code / 100 % 10, code % 100)
        })
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `ncclGetVersion(int*)`.
type GetVersion = unsafe extern "C" fn(*mut c_int) -> ncclResult_t;

/// The NCCL release in this process, or `None` when `ncclGetVersion` cannot be found (NCCL linked
/// statically without exporting it) or fails. `logfn` is the logger NCCL passed to `init`.
pub fn detect(logfn: ncclDebugLogger_t) -> Option<NcclVersion> {
    const SYMBOL: &CStr = c"ncclGetVersion";
    // SAFETY: RTLD_DEFAULT is a valid pseudo-handle and SYMBOL a NUL-terminated string.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, SYMBOL.as_ptr()) };
    let symbol = if global.is_null() {
        in_object_of(logfn? as *const c_void, SYMBOL)?
    } else {
        global
    };
    // SAFETY: `ncclGetVersion` has had this signature in every NCCL release; it writes one int.
    let get: GetVersion = unsafe { std::mem::transmute::<*mut c_void, GetVersion>(symbol) };
    let mut code: c_int = 0;
    // SAFETY: `code` is a valid, writable int for the call.
    let result = unsafe { get(&mut code) };
    (result == ncclSuccess).then(|| NcclVersion::from_code(code)).flatten()
}

/// `symbol` in the loaded object that contains `address`, if it exports it.
fn in_object_of(address: *const c_void, symbol: &CStr) -> Option<*mut c_void> {
    // SAFETY: all-zero is a valid `Dl_info` (NULL pointers), filled by `dladdr`.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only reads the address and fills `info`.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is the loader's NUL-terminated path of a loaded object; RTLD_NOLOAD only
    // takes a reference to it when it is loaded already, never loads anything.
    let handle = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: `handle` came from `dlopen` above and `symbol` is NUL-terminated.
    let found = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    // SAFETY: drops the reference taken above; the object stays loaded (NCCL itself holds it).
    unsafe { libc::dlclose(handle) };
    (!found.is_null()).then_some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_as_nccl_encodes_them() {
        assert_eq!(NcclVersion::from_code(23102), Some(NcclVersion::new(2, 31, 2)));
        assert_eq!(NcclVersion::from_code(22307), Some(NcclVersion::new(2, 23, 7)));
        assert_eq!(NcclVersion::from_code(2804), Some(NcclVersion::new(2, 8, 4)));
        assert_eq!(NcclVersion::from_code(0), None);
        assert_eq!(NcclVersion::from_code(-1), None);
        assert!(NcclVersion::from_code(23007).unwrap() < NcclVersion::V2_31);
        assert_eq!(NcclVersion::new(2, 31, 2).to_string(), "2.31.2");
    }
}
