//! Where a sealed window's lanes are in the records the consumer read: lane after lane, so a
//! handle's slot (its lane's first slot plus its index in the lane) maps to an index.
//! Called on: the telemetry thread (or `finalize`).
#![forbid(unsafe_code)]

use crate::record::handle::{LANES, MAX_SLOTS};

/// Where a sealed window's lanes are in its records: the window's slot `l` × `stride` + `i` is
/// `records[start[l] + i]` for `i < len[l]`.
#[derive(Clone, Copy, Debug)]
pub struct Lanes {
    /// Slots between the first slots of two lanes.
    pub stride: u32,
    /// Index in the records of each lane's first slot.
    pub start: [u32; LANES],
    /// Slots read from each lane.
    pub len: [u32; LANES],
}

impl Lanes {
    /// A single lane of `len` records: `records[i]` is slot `i`.
    pub fn single(len: usize) -> Lanes {
        let len = len as u32;
        Lanes {
            stride: MAX_SLOTS + 1,
            start: [0, len, len],
            len: [len, 0, 0],
        }
    }

    /// Index in the records of the window's slot `slot`, if it was read.
    pub fn index(&self, slot: u32) -> Option<usize> {
        let (lane, i) = ((slot / self.stride) as usize, slot % self.stride);
        let (start, len) = (self.start.get(lane)?, self.len.get(lane)?);
        (i < *len).then_some((start + i) as usize)
    }
}
