//! The registry's slot reuse through a full generation wrap, on the plugin linked into this
//! binary (set up on defaults with export off by [`setup`]): it checks the stale-handle counter
//! after each call and a communicator's late-record count, process internals that no export
//! carries at that granularity, so it is a unit test of the registry and the handle codec rather
//! than a run of the shipped library.

use std::collections::HashMap;

use nccl_profiler_otel::comm;
use nccl_profiler_otel::record::handle::{Context, GEN_MASK};
use nccl_profiler_otel::stats::STATS;

use crate::support::emulator::{self, H, pid};
use crate::{next_hash, setup};

#[test]
fn slot_reuse_wraps_generations_and_stale_contexts_and_handles_stay_stale() {
    let (_serial, s) = setup();
    let p = &s.internal;
    // Every init takes the lowest free slot, with that slot's next generation: cycle init/finalize
    // until one slot has gone through all 4095 generations and wrapped. A keeper communicator
    // stays live so that no finalize is the last one (that one flushes the exporter, 10-100 ms).
    // `register` skips a slot the telemetry thread is polling (its consumer lock is taken) or whose
    // windows are still draining, so the slot may vary.
    let (keeper, _) = p.init(None, next_hash(), 1, 2, 1);
    let slots0 = comm::all().count();
    let mut last_generation: HashMap<u16, u16> = HashMap::new();
    let mut uses: HashMap<u16, usize> = HashMap::new();
    let mut previous: Option<emulator::Comm> = None;
    let mut open: Option<(u16, H, H)> = None;
    let mut stale_checks = 0;
    let mut wrapped = None;
    let mut i = 0;
    while wrapped.is_none() {
        assert!(
            i < 3 * (GEN_MASK as usize + 1),
            "no slot wrapped in {i} cycles: {uses:?}"
        );
        let (c, _) = p.init(None, next_hash(), 1, 2, 1);
        let ctx = Context::decode(c.context as u64).expect("a context of ours");
        let generation = ctx.comm.generation;
        assert_ne!(generation, 0, "generation 0 is never handed out");
        if let Some(last) = last_generation.insert(ctx.comm.slot, generation) {
            let expected = (u32::from(last) % GEN_MASK + 1) as u16;
            assert_eq!(
                generation, expected,
                "slot {} advances by one generation",
                ctx.comm.slot
            );
            if generation == 1 {
                wrapped = Some(ctx.comm.slot);
            }
        }
        *uses.entry(ctx.comm.slot).or_default() += 1;
        if let Some(old) = previous.take() {
            // The previous communicator (finalized) is stale, also as a context for new events.
            let stale = STATS.stale.get();
            let h = p.coll(&old, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
            assert!(h.is_null(), "a finalized communicator's context is stale");
            p.finalize(old.context);
            assert!(STATS.stale.get() >= stale + 2);
        }
        if let Some((slot, coll, op)) = open.take().filter(|(slot, ..)| *slot == ctx.comm.slot) {
            // Events the previous communicator in this slot left open: their handles name epochs
            // its windows have left, so they are stale for the new one, not late records of it.
            let stale = STATS.stale.get();
            p.stop(coll);
            assert!(
                p.proxy_step(c.context, op, c.rank, 0).is_null(),
                "a stale parent takes no child"
            );
            assert_eq!(STATS.stale.get(), stale + 2, "slot {slot}: stale, not late");
            let now = comm::get(ctx.comm).expect("live");
            assert_eq!(now.drop_counts().late, 0);
            stale_checks += 1;
        }
        if i % 512 == 0 {
            let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
            assert!(!coll.is_null(), "recorded at generation {generation}");
            p.stop(coll);
        }
        if i % 64 == 0 {
            let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
            let op = p.proxy_op(c.context, coll, pid(), c.rank, 0, 1, 1, true);
            assert!(!op.is_null());
            open = Some((ctx.comm.slot, coll, op));
        }
        p.finalize(c.context);
        previous = Some(c);
        i += 1;
    }
    let slots1 = comm::all().count();
    eprintln!(
        "lifecycle: slot {wrapped:?} wrapped after {i} init/finalize cycles; uses per slot {uses:?}; \
         {stale_checks} stale handles of a slot's earlier communicator"
    );
    assert!(
        stale_checks > 0,
        "no slot was reused right after a communicator left events open"
    );
    assert!(
        slots1 <= slots0 + 2,
        "slots allocated grew from {slots0} to {slots1}: {uses:?}"
    );
    p.finalize(keeper.context);
}
