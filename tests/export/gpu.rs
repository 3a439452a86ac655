//! The GPU of each communicator on its member series (`nccl.comm.member`): `gpu.uuid` and
//! `gpu.pci_bus_id` in DCGM's formats when the CUDA driver (here its stand-in,
//! `support::cuda`) is loaded and a context is current at `init`; absent, and `init` still
//! succeeds, when it is not loaded or no context is current.

use std::collections::BTreeMap;

use crate::support::cuda::{self, Driver};
use crate::support::emulator::Plugin;
use crate::support::export as sx;
use crate::support::otlp_receiver::{Receiver, metrics, points};

#[test]
fn member_series_name_each_communicators_gpu() {
    let Some(_serial) = sx::own_process(module_path!(), "member_series_name_each_communicators_gpu") else {
        return;
    };
    let rx = Receiver::start();
    // SAFETY: this process runs this test alone (`own_process`); nothing else touches the environment.
    unsafe { sx::base_env(&[("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", rx.endpoint().as_str())]) };
    let p = Plugin::in_process();
    // Before the driver is loaded, then on devices 1 and 3 (one process, two GPUs), then on a
    // thread with no current context. `init` asserts success every time.
    let before = p.init(Some("before"), 0x6B0_0001, 1, 2, 0).0;
    let driver = Driver::load();
    let mut comms = vec![before];
    for (name, hash, device) in [
        ("dev1", 0x6B0_0002, Some(1)),
        ("dev3", 0x6B0_0003, Some(3)),
        ("none", 0x6B0_0004, None),
    ] {
        driver.set_device(device);
        comms.push(p.init(Some(name), hash, 1, 2, 0).0);
    }
    for c in &comms {
        p.finalize(c.context); // the last one exports before it returns
    }

    let reqs = rx.requests();
    sx::check_documented(&reqs);
    let mut gpus: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for point in metrics(&reqs)
        .into_iter()
        .filter(|m| m.name == "nccl.comm.member")
        .flat_map(points)
    {
        let gpu = point.attrs.iter().filter(|(k, _)| k.starts_with("gpu."));
        gpus.insert(
            point.attrs["nccl.comm.name"].clone(),
            gpu.map(|(k, v)| (k.clone(), v.clone())).collect(),
        );
    }
    let on = |d: u8| {
        vec![
            ("gpu.pci_bus_id".to_owned(), cuda::pci_bus_id(d)),
            ("gpu.uuid".to_owned(), cuda::uuid(d)),
        ]
    };
    let want = BTreeMap::from([
        ("before".to_owned(), vec![]),
        ("dev1".to_owned(), on(1)),
        ("dev3".to_owned(), on(3)),
        ("none".to_owned(), vec![]),
    ]);
    assert_eq!(gpus, want);
    assert_eq!(cuda::pci_bus_id(3), "00000000:3E:00.0");
}
