//! ABI v7 as released in NCCL 2.31.2 (spec 7.2): the v6 descriptor grown to 136 bytes
//! (`userTag`, `kernelVariant`, `isSymColl`, KernelPhase), every v6 field at its v6 offset; its
//! state arguments are v5's type.
//!
//! Other definitions under the name `ncclProfiler_v7` pass the 112-byte v6 descriptor, or one
//! without `userTag` (spec 8.x.3): the fields only NVIDIA's 2.31.2 layout has (`userTag`,
//! `isSymColl`) are read only when the description says that layout is the one running
//! ([`Abi::extensions`]).

use super::{Abi, api_family, ce_coll, coll_api};
use crate::bindings::{
    ncclProfileCeColl, ncclProfileColl, ncclProfileKernelPhase, ncclProfileP2p, ncclProfilerEventDescr_v7_t,
};

api_family!(7, ncclProfilerEventDescr_v7_t {
    coll_api!();
    ce_coll!();

    fn user_tag(&self) -> u64 {
        if !Abi::current().extensions() {
            return 0;
        }
        // SAFETY: `type` selects the member NCCL filled; `userTag` is a plain integer of it
        // (the 2.31.2 layout, which the description vouches for).
        unsafe {
            match self.type_ {
                t if t == u64::from(ncclProfileColl) => self.__bindgen_anon_1.coll.userTag,
                t if t == u64::from(ncclProfileP2p) => self.__bindgen_anon_1.p2p.userTag,
                t if t == u64::from(ncclProfileCeColl) => self.__bindgen_anon_1.ceColl.userTag,
                _ => 0,
            }
        }
    }

    fn kernel_phase(&self) -> Option<(u8, u64)> {
        if self.type_ != u64::from(ncclProfileKernelPhase) {
            return None;
        }
        // SAFETY: `type` is KernelPhase, so NCCL filled `kernelPhase` (integers; its name
        // pointer is not read). Only a layout that has the member sends the type.
        let k = unsafe { &self.__bindgen_anon_1.kernelPhase };
        Some((k.phaseId, k.pTimer))
    }

    fn symmetric(&self) -> bool {
        // SAFETY: `type` is Coll, so NCCL filled `coll`; `isSymColl` is a `bool` NCCL writes as
        // 0 or 1 (the 2.31.2 layout, which the description vouches for).
        Abi::current().extensions()
            && self.type_ == u64::from(ncclProfileColl)
            && unsafe { std::ptr::read(std::ptr::addr_of!(self.__bindgen_anon_1.coll.isSymColl).cast::<u8>()) } != 0
    }
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{Descriptor, Filled};

    /// Makes the process's description one whose v7 extension fields are read or not.
    fn extensions(on: bool) {
        Abi::new(7, None, Some(on), false).install();
    }

    /// The fields past the v6 prefix are read only while the running layout is known.
    #[test]
    fn extensions_are_read_only_when_the_layout_is_known() {
        let read = |d: &ncclProfilerEventDescr_v7_t| {
            // SAFETY: a Coll or P2p descriptor whose string pointers are NULL, as NCCL fills one.
            let d = unsafe { Filled::from_ptr(d) }.unwrap();
            (d.user_tag(), d.symmetric())
        };
        let mut d = ncclProfilerEventDescr_v7_t {
            type_: u64::from(ncclProfileColl),
            ..Default::default()
        };
        d.__bindgen_anon_1.coll.userTag = 5;
        d.__bindgen_anon_1.coll.isSymColl = true;
        let before = Abi::current();
        extensions(false);
        assert_eq!(read(&d), (0, false));
        extensions(true);
        assert_eq!(read(&d), (5, true));
        d.type_ = u64::from(ncclProfileP2p);
        d.__bindgen_anon_1.p2p.userTag = 6;
        assert_eq!(read(&d), (6, false));
        before.install();
    }
}
