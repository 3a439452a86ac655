//! Loom model of one window: two producers claim and publish while the consumer opens, closes,
//! seals, reads and resets it. Run: `RUSTFLAGS="--cfg loom" cargo test --release --test loom_window`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use nccl_profiler_otel::event::{Body, Record};
use nccl_profiler_otel::window::{Window, WindowState};

fn rec(id: u64) -> Record {
    Record {
        id,
        ts: id,
        body: Body::Stop,
    }
}

#[test]
fn claim_close_process_reset() {
    loom::model(|| {
        let w = Arc::new(Window::new(2).unwrap());
        assert!(w.open());
        let producers: Vec<_> = (1..=2)
            .map(|id| {
                let w = w.clone();
                thread::spawn(move || w.push(|_| rec(id)).map(|c| (c, id)))
            })
            .collect();
        // Consumer: close and seal while producers may still be claiming.
        assert!(w.close());
        let n = w.seal().unwrap();
        let mut seen = Vec::new();
        for slot in 0..n {
            // A claimed slot is published eventually; spin like the consumer does.
            let r = loop {
                if let Some(r) = w.published(slot) {
                    break r;
                }
                thread::yield_now();
            };
            seen.push(r.id);
        }
        let claims: Vec<_> = producers.into_iter().filter_map(|p| p.join().unwrap()).collect();
        // Every successful claim is read exactly once, with its own record; failed ones are not.
        assert_eq!(claims.len(), n as usize);
        for (claim, id) in &claims {
            assert_eq!(seen[claim.slot as usize], *id);
            assert_eq!(claim.epoch, 1);
        }
        assert!(w.reset(n));
        assert_eq!(w.state(), WindowState::Ready);
        assert!(w.open());
        assert_eq!(w.push(|_| rec(3)).map(|c| c.epoch), Some(2));
        assert_eq!(w.published(0).map(|r| r.id), Some(3));
    });
}
