//! Which events are open: the one rule every reader of the record stream asks (the consumer's
//! scan of a filling or closing window, the linking pass, the operations in flight). An event is
//! open from its start record until its first `Stop`, except a receive ProxyOp, which is open
//! only once its `InProgress` says NCCL progresses it (receive ops NCCL never progresses never
//! stop, spec 3.6). Pure; called on the telemetry thread (or `finalize`).
#![forbid(unsafe_code)]

use crate::record::Body;

/// What was read of one event so far, as far as its being open goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Life {
    /// Its start record was read.
    pub started: bool,
    /// Its `InProgress` was read (a receive op that will stop).
    pub progressing: bool,
    /// Its first `Stop` was read.
    pub stopped: bool,
}

impl Life {
    /// Whether the event (`recv`: a receive ProxyOp) is open: started, not stopped, and
    /// progressing if it is a receive op.
    pub fn is_open(self, recv: bool) -> bool {
        self.started && !self.stopped && (self.progressing || !recv)
    }

    /// Reads `body`, one record of the event (`recv`: a receive ProxyOp); a start record counts
    /// only when the caller read it at the event's own slot. Returns the change in open events:
    /// +1 when the event opens, −1 when it closes, else 0.
    pub fn read(&mut self, body: &Body, recv: bool) -> i32 {
        let was = self.is_open(recv);
        match body {
            b if b.opens() => self.started = true,
            Body::InProgress if recv && self.started && !self.stopped => self.progressing = true,
            Body::Stop if self.started => self.stopped = true,
            _ => {}
        }
        i32::from(self.is_open(recv)) - i32::from(was)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receive_op_is_open_only_while_progressing() {
        let mut op = Life::default();
        let start = Body::ProxyOp(crate::record::ProxyOpStart {
            parent: 1,
            rank: 0,
            peer: 1,
            channel: 0,
            send: false,
            origin: 0,
        });
        assert_eq!(op.read(&start, true), 0);
        assert_eq!(op.read(&Body::InProgress, true), 1);
        assert_eq!(op.read(&Body::InProgress, true), 0);
        assert_eq!(op.read(&Body::Stop, true), -1);
        assert_eq!(op.read(&Body::Stop, true), 0);
        let mut never = Life::default();
        assert_eq!(never.read(&start, true), 0);
        assert_eq!(never.read(&Body::Stop, true), 0);
        assert_eq!(never.read(&Body::InProgress, true), 0, "a stopped op does not progress");
    }

    #[test]
    fn other_events_are_open_from_start_to_first_stop() {
        let mut ev = Life::default();
        assert_eq!(ev.read(&Body::Stop, false), 0, "no stop before the start");
        assert_eq!(
            ev.read(
                &Body::KernelCh {
                    parent: 1,
                    channel: 0,
                    gpu_start: 0,
                },
                false
            ),
            1
        );
        assert_eq!(ev.read(&Body::InProgress, false), 0);
        assert_eq!(ev.read(&Body::Stop, false), -1);
        assert_eq!(ev.read(&Body::Stop, false), 0);
    }
}
