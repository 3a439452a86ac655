//! The 28-byte form of a record in the proxy and kernel lanes ([`super::handle::Kind::lane`] 1
//! and 2): with its 4-byte stamp a slot is 32 bytes, two to a cache line and never across one.
//! Those lanes hold ProxyOp, ProxyStep, KernelCh and KernelPhase events and their states, whose
//! records carry at most a time or a parent handle plus one 64-bit value and a byte; collective
//! starts (three 64-bit values and six small ones) stay full records in the application lane.
//!
//! Two 64-bit words follow the handle: `x` is the record's time, or for a start (never timed)
//! its parent handle; `y` is the payload. [`Compact::pack`] refuses a record it cannot hold
//! exactly (a timed start, a collective body, a PXN op that names a parent): the caller claims no
//! slot for it and counts the drop. An all-zero value (a slot whose page was released) unpacks as
//! a record with handle 0, which the consumer skips. Called on: NCCL's proxy and profiler threads
//! (pack), the telemetry thread (unpack); pure.
#![forbid(unsafe_code)]

use super::{Body, Mark, ProxyOpStart, Record};

/// A record of the proxy or kernel lane.
#[repr(C, packed(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compact {
    /// Which [`Body`] variant (0: the filler).
    tag: u8,
    /// A channel, phase or [`Mark`].
    small: u8,
    /// [`SEND`] and [`FOREIGN`] of a ProxyOp start.
    flags: u16,
    /// Handle of the event.
    id: u64,
    /// Time, or a start's parent handle (a PXN op's origin digest).
    x: u64,
    /// Payload.
    y: u64,
}

const SEND: u16 = 1;
const FOREIGN: u16 = 2;

const PROXY_OP: u8 = 1;
const PROXY_STEP: u8 = 2;
const KERNEL_CH: u8 = 3;
const KERNEL_PHASE: u8 = 4;
const PEER_WAIT: u8 = 5;
const SEND_WAIT: u8 = 6;
const OP_BYTES: u8 = 7;
const IN_PROGRESS: u8 = 8;
const KERNEL_CH_STOP: u8 = 9;
const TAG: u8 = 10;
const PHASE_STOP: u8 = 11;
const CLAIM: u8 = 12;
const STOP: u8 = 13;
const RECV_STEP: u8 = 14;
const GPU_WAIT: u8 = 15;
const RECV_COUNT: u8 = 16;

const MARKS: [Mark; 4] = [Mark::Base, Mark::Sent, Mark::SentBefore, Mark::Done];

impl Compact {
    /// `r` in compact form, or `None` when this form cannot hold it exactly.
    #[inline(always)]
    pub fn pack(r: &Record) -> Option<Compact> {
        // A start's `x` is its parent: it has no room for a time (starts here are never timed).
        let start = |tag, small, flags, parent, y| (r.ts == 0).then_some((tag, small, flags, parent, y));
        let timed = |tag, small, y| Some((tag, small, 0, r.ts, y));
        let (tag, small, flags, x, y) = match r.body {
            Body::ProxyOp(op) => {
                let (x, foreign) = match (op.parent, op.origin) {
                    (parent, 0) => (parent, 0),
                    (0, origin) => (u64::from(origin), FOREIGN),
                    _ => return None,
                };
                let y = u64::from(op.rank as u32) | u64::from(op.peer as u32) << 32;
                start(PROXY_OP, op.channel, foreign | u16::from(op.send), x, y)?
            }
            Body::ProxyStep { parent, step } => start(PROXY_STEP, 0, 0, parent, u64::from(step as u32))?,
            Body::RecvStep { parent, step } => start(RECV_STEP, 0, 0, parent, u64::from(step as u32))?,
            Body::KernelCh {
                parent,
                channel,
                gpu_start,
            } => start(KERNEL_CH, channel, 0, parent, gpu_start)?,
            Body::KernelPhase {
                parent,
                phase,
                gpu_start,
            } => start(KERNEL_PHASE, phase, 0, parent, gpu_start)?,
            Body::PeerWait => timed(PEER_WAIT, 0, 0)?,
            Body::GpuWait => timed(GPU_WAIT, 0, 0)?,
            Body::RecvCount { received, steps } => timed(RECV_COUNT, u8::from(received), u64::from(steps as u32))?,
            Body::SendWait { bytes } => timed(SEND_WAIT, 0, bytes)?,
            Body::OpBytes { mark, total } => timed(OP_BYTES, mark as u8, total)?,
            Body::InProgress => timed(IN_PROGRESS, 0, 0)?,
            Body::KernelChStop { gpu_stop } => timed(KERNEL_CH_STOP, 0, gpu_stop)?,
            Body::Tag { tag } => timed(TAG, 0, tag)?,
            Body::PhaseStop { gpu_stop } => timed(PHASE_STOP, 0, gpu_stop)?,
            Body::Claim { api } => timed(CLAIM, 0, api)?,
            Body::Stop => timed(STOP, 0, 0)?,
            Body::Coll(_) | Body::P2p(_) | Body::Api(_) => return None,
        };
        Some(Compact {
            tag,
            small,
            flags,
            id: r.id,
            x,
            y,
        })
    }

    /// The same record with the handle `id`.
    #[inline(always)]
    pub fn with_id(self, id: u64) -> Compact {
        Compact { id, ..self }
    }

    /// The record this was packed from; an all-zero value (or anything else unknown) is a record
    /// with handle 0.
    pub fn unpack(self) -> Record {
        let Compact {
            tag,
            small,
            flags,
            id,
            x,
            y,
        } = self;
        let start = |body| Record { id, ts: 0, body };
        let timed = |body| Record { id, ts: x, body };
        match tag {
            PROXY_OP => start(Body::ProxyOp(ProxyOpStart {
                parent: if flags & FOREIGN == 0 { x } else { 0 },
                rank: y as u32 as i32,
                peer: (y >> 32) as u32 as i32,
                channel: small,
                send: flags & SEND != 0,
                origin: if flags & FOREIGN != 0 { x as u32 } else { 0 },
            })),
            PROXY_STEP => start(Body::ProxyStep {
                parent: x,
                step: y as u32 as i32,
            }),
            RECV_STEP => start(Body::RecvStep {
                parent: x,
                step: y as u32 as i32,
            }),
            KERNEL_CH => start(Body::KernelCh {
                parent: x,
                channel: small,
                gpu_start: y,
            }),
            KERNEL_PHASE => start(Body::KernelPhase {
                parent: x,
                phase: small,
                gpu_start: y,
            }),
            PEER_WAIT => timed(Body::PeerWait),
            GPU_WAIT => timed(Body::GpuWait),
            RECV_COUNT => timed(Body::RecvCount {
                received: small != 0,
                steps: y as u32 as i32,
            }),
            SEND_WAIT => timed(Body::SendWait { bytes: y }),
            OP_BYTES if usize::from(small) < MARKS.len() => timed(Body::OpBytes {
                mark: MARKS[usize::from(small)],
                total: y,
            }),
            IN_PROGRESS => timed(Body::InProgress),
            KERNEL_CH_STOP => timed(Body::KernelChStop { gpu_stop: y }),
            TAG => timed(Body::Tag { tag: y }),
            PHASE_STOP => timed(Body::PhaseStop { gpu_stop: y }),
            CLAIM => timed(Body::Claim { api: y }),
            STOP => timed(Body::Stop),
            _ => Record {
                id: 0,
                ts: 0,
                body: Body::Stop,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Algo, CollStart, Datatype, Func, Proto};
    use proptest::prelude::*;

    fn bodies(a: u64, b: u64, small: u8, i: i32, j: i32, k: u32) -> Vec<Body> {
        let op = |parent, origin, send| {
            Body::ProxyOp(ProxyOpStart {
                parent,
                rank: i,
                peer: j,
                channel: small,
                send,
                origin,
            })
        };
        vec![
            op(a, 0, true),
            op(a, 0, false),
            op(0, k | 1, true),
            Body::ProxyStep { parent: a, step: i },
            Body::RecvStep { parent: a, step: j },
            Body::KernelCh {
                parent: a,
                channel: small,
                gpu_start: b,
            },
            Body::KernelPhase {
                parent: a,
                phase: small,
                gpu_start: b,
            },
            Body::PeerWait,
            Body::GpuWait,
            Body::RecvCount {
                received: small % 2 == 1,
                steps: i,
            },
            Body::SendWait { bytes: b },
            Body::OpBytes {
                mark: MARKS[usize::from(small) % 4],
                total: b,
            },
            Body::InProgress,
            Body::KernelChStop { gpu_stop: b },
            Body::Tag { tag: b },
            Body::PhaseStop { gpu_stop: b },
            Body::Claim { api: b },
            Body::Stop,
        ]
    }

    proptest! {
        #[test]
        fn every_lane_1_and_2_record_round_trips(id in any::<u64>(), ts in any::<u64>(), a in any::<u64>(),
                                                   b in any::<u64>(), small in any::<u8>(), i in any::<i32>(),
                                                   j in any::<i32>(), k in any::<u32>()) {
            for body in bodies(a, b, small, i, j, k) {
                let ts = if matches!(body, Body::ProxyOp(_) | Body::ProxyStep { .. } | Body::RecvStep { .. }
                    | Body::KernelCh { .. } | Body::KernelPhase { .. }) { 0 } else { ts };
                let r = Record { id, ts, body };
                prop_assert_eq!(Compact::pack(&r).map(Compact::unpack), Some(r));
            }
        }

        #[test]
        fn unpack_never_panics(tag in any::<u8>(), small in any::<u8>(), flags in any::<u16>(), x in any::<u64>(),
                               y in any::<u64>()) {
            let _ = Compact { tag, small, flags, id: 1, x, y }.unpack();
        }
    }

    #[test]
    fn what_it_cannot_hold_exactly_is_refused() {
        let coll = CollStart {
            seq: 1,
            count: 2,
            func: Func::AllReduce,
            algo: Algo::Ring,
            proto: Proto::Simple,
            datatype: Datatype::Float32,
            n_channels: 8,
            graph: None,
            sample: crate::record::Sample::ALL,
        };
        let refused = [
            Record {
                id: 1,
                ts: 5,
                body: Body::ProxyStep { parent: 2, step: 0 },
            },
            Record {
                id: 1,
                ts: 0,
                body: Body::Coll(coll),
            },
            Record {
                id: 1,
                ts: 0,
                body: Body::Api(coll),
            },
            Record {
                id: 1,
                ts: 0,
                body: Body::ProxyOp(ProxyOpStart {
                    parent: 2,
                    rank: 0,
                    peer: 1,
                    channel: 0,
                    send: true,
                    origin: 7,
                }),
            },
        ];
        for r in refused {
            assert_eq!(Compact::pack(&r), None, "{r:?}");
        }
        let zero = Compact {
            tag: 0,
            small: 0,
            flags: 0,
            id: 0,
            x: 0,
            y: 0,
        };
        assert_eq!(zero.unpack().id, 0, "a released page reads as a record to skip");
        assert_eq!(std::mem::size_of::<Compact>(), 28);
        assert_eq!(std::mem::align_of::<Compact>(), 4);
    }
}
