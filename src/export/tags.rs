//! The `nccl.user_tag` attribute: the application's tag of a collective or P2P send (NCCL 2.31's
//! `ncclCollConfig_t.userProfilerTag`), bounded. The first [`MAX_TAGS`] distinct tags of the
//! process are exported as themselves (decimal; NCCL's reserved values, bit 63 set, as
//! `reserved:0x…`); any later tag as `other`, its operations counted. Untagged operations (tag 0)
//! carry no such attribute. Called on: the telemetry thread (through the pipeline).
#![forbid(unsafe_code)]

use std::collections::HashMap;

/// Distinct tags exported as themselves, per process.
pub const MAX_TAGS: usize = 64;

/// The value of every tag past [`MAX_TAGS`].
pub const OTHER: &str = "other";

/// The tags seen so far and their attribute values.
#[derive(Default)]
pub(super) struct UserTags {
    names: HashMap<u64, String>,
}

impl UserTags {
    /// The attribute value of `tag` (non-zero), and whether it is past the bound.
    pub(super) fn name(&mut self, tag: u64) -> (String, bool) {
        if let Some(name) = self.names.get(&tag) {
            return (name.clone(), false);
        }
        if self.names.len() >= MAX_TAGS {
            return (OTHER.to_owned(), true);
        }
        let name = if tag >> 63 != 0 {
            format!("reserved:{tag:#x}")
        } else {
            tag.to_string()
        };
        self.names.insert(tag, name.clone());
        (name, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_named_up_to_the_bound_then_other() {
        let mut t = UserTags::default();
        assert_eq!(t.name(7), ("7".to_owned(), false));
        assert_eq!(t.name(1 << 63 | 1), ("reserved:0x8000000000000001".to_owned(), false));
        for tag in 100..100 + MAX_TAGS as u64 - 2 {
            assert!(!t.name(tag).1);
        }
        assert_eq!(t.name(5), (OTHER.to_owned(), true));
        assert_eq!(t.name(7), ("7".to_owned(), false), "a known tag keeps its name");
    }
}
