//! `NCCL_PROFILER_OTEL_ENABLE=0`: `init` succeeds with a NULL context and leaves the activation
//! mask 0, so NCCL starts no events; every callback tolerates the NULL context NCCL then passes.
//! The shipped library, `dlopen`ed.

use crate::support::emulator::{H, Plugin, pid, ty};
use crate::support::process;

#[test]
fn disabled_means_success_with_a_null_context() {
    let _serial = crate::SERIAL.lock();
    if !process::own_process(module_path!(), "disabled_means_success_with_a_null_context") {
        return;
    }
    // SAFETY: this process runs this test alone; set before the plugin reads its configuration.
    unsafe { std::env::set_var("NCCL_PROFILER_OTEL_ENABLE", "0") };
    let p = Plugin::load_shipped();
    let (c, mask) = p.init(Some("off"), 0x0FF, 1, 2, 0);
    assert!(c.context.is_null(), "disabled: NULL context");
    assert_eq!(mask, 0, "disabled: no event type requested");
    let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 8, 1, 0);
    assert!(coll.is_null());
    let op = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, true);
    assert!(op.is_null());
    let step = p.proxy_step(c.context, op, 0, 0);
    p.state(step, ty::SEND_WAIT, 1);
    p.stop(step);
    p.stop(op);
    p.finalize(c.context);
}
