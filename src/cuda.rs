//! The GPU of a communicator: the device of the CUDA context current on NCCL's thread at `init`,
//! asked of the CUDA driver API when the process has loaded the driver already (`dlopen` with
//! `RTLD_NOLOAD`: this library never loads CUDA), as its UUID and PCI bus id in DCGM's formats.
//! Without the driver, one of its functions or a current context, the identity is unknown: said
//! once at INFO, never an error. The driver's functions are resolved once per process, by the
//! first `init` that finds the driver loaded; its handle is never closed, so they stay valid.
//! Called on: NCCL's init thread (where the communicator's context is current), never the hot
//! path (`dlopen` and `dlsym` take the loader's lock).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::record::Gpu;

/// The driver library's name, as its `DT_SONAME` has it.
const LIBRARY: &CStr = c"libcuda.so.1";

/// `CUresult cuCtxGetDevice(CUdevice*)`.
type CtxGetDevice = unsafe extern "C" fn(*mut c_int) -> c_int;
/// `CUresult cuDeviceGetPCIBusId(char*, int, CUdevice)`.
type DeviceGetPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
/// `CUresult cuDeviceGetUuid(CUuuid*, CUdevice)` (and `_v2`); `CUuuid` is 16 bytes. The plain
/// version first: on a MIG instance `_v2` gives the instance's own UUID, which DCGM's `UUID` label
/// never is (DCGM labels an instance with its GPU's); outside MIG both give the GPU's.
type DeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;

/// The driver functions we call.
struct Driver {
    ctx_get_device: CtxGetDevice,
    pci_bus_id: DeviceGetPciBusId,
    uuid: DeviceGetUuid,
}

/// Why the GPU is unknown.
enum Unknown {
    NotLoaded,
    Missing(&'static CStr),
    Failed(&'static str, c_int),
}

/// The GPU of the CUDA context current on the calling thread; fields the driver cannot give are
/// `None`. Called on: NCCL's init thread.
pub fn current_gpu() -> Gpu {
    let Some(driver) = driver() else {
        return Gpu::default();
    };
    let mut device: c_int = 0;
    // SAFETY: `cuCtxGetDevice` writes one `CUdevice` (an int) to the valid pointer it is given.
    let rc = unsafe { (driver.ctx_get_device)(&mut device) };
    if rc != 0 {
        unknown(Unknown::Failed("cuCtxGetDevice", rc));
        return Gpu::default();
    }
    // NUL-terminated whatever the driver writes: it is given one byte less than the buffer.
    let mut bus = [0u8; 32];
    // SAFETY: the driver writes at most `len` bytes (a NUL-terminated string) into the buffer.
    let rc = unsafe { (driver.pci_bus_id)(bus.as_mut_ptr().cast(), bus.len() as c_int - 1, device) };
    let pci_bus_id = if rc == 0 {
        CStr::from_bytes_until_nul(&bus)
            .ok()
            .and_then(|s| dcgm_pci_bus_id(&s.to_string_lossy()))
    } else {
        unknown(Unknown::Failed("cuDeviceGetPCIBusId", rc));
        None
    };
    let mut bytes = [0u8; 16];
    // SAFETY: the driver writes one 16-byte `CUuuid` to the valid pointer it is given.
    let rc = unsafe { (driver.uuid)(&mut bytes, device) };
    let uuid = if rc == 0 {
        Some(dcgm_uuid(&bytes))
    } else {
        unknown(Unknown::Failed("cuDeviceGetUuid", rc));
        None
    };
    Gpu { uuid, pci_bus_id }
}

/// The driver's functions: resolved once, by the first call that finds the driver loaded.
fn driver() -> Option<&'static Driver> {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    if let Some(driver) = DRIVER.get() {
        return Some(driver);
    }
    match resolve() {
        // Two threads may resolve at once: both results are the same functions.
        Ok(driver) => Some(DRIVER.get_or_init(|| driver)),
        Err(why) => {
            unknown(why);
            None
        }
    }
}

/// Looks up the driver's functions in the loaded driver, keeping it open for good.
fn resolve() -> Result<Driver, Unknown> {
    // SAFETY: the name is NUL-terminated; RTLD_NOLOAD only takes a reference to the library when
    // it is loaded already, so nothing is loaded and no initialiser runs.
    let handle = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return Err(Unknown::NotLoaded);
    }
    let symbol = |name: &'static CStr| -> Result<*mut c_void, Unknown> {
        // SAFETY: `handle` came from `dlopen` above and is open; `name` is NUL-terminated.
        let found = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if found.is_null() { Err(Unknown::Missing(name)) } else { Ok(found) }
    };
    let found = (|| {
        let ctx_get_device = symbol(c"cuCtxGetDevice")?;
        let pci_bus_id = symbol(c"cuDeviceGetPCIBusId")?;
        let uuid = symbol(c"cuDeviceGetUuid").or_else(|_| symbol(c"cuDeviceGetUuid_v2"))?;
        Ok((ctx_get_device, pci_bus_id, uuid))
    })();
    let (ctx_get_device, pci_bus_id, uuid) = match found {
        Ok(found) => found,
        Err(why) => {
            // SAFETY: drops the reference taken above; nothing of the library is kept.
            unsafe { libc::dlclose(handle) };
            return Err(why);
        }
    };
    // SAFETY: each symbol is the CUDA driver API function of that name, with the signature its
    // type states (`cuda.h`); the handle stays open, so the functions stay mapped.
    unsafe {
        Ok(Driver {
            ctx_get_device: std::mem::transmute::<*mut c_void, CtxGetDevice>(ctx_get_device),
            pci_bus_id: std::mem::transmute::<*mut c_void, DeviceGetPciBusId>(pci_bus_id),
            uuid: std::mem::transmute::<*mut c_void, DeviceGetUuid>(uuid),
        })
    }
}

/// Says at INFO, the first time only, why a communicator's GPU is unknown.
fn unknown(why: Unknown) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let why = match why {
        Unknown::NotLoaded => format!("{} is not loaded in this process", LIBRARY.to_string_lossy()),
        Unknown::Missing(name) => format!("the CUDA driver has no {}", name.to_string_lossy()),
        Unknown::Failed(call, rc) => format!("{call} returned CUresult {rc}"),
    };
    tracing::info!("GPU identity unknown ({why}): nccl.comm.member carries no gpu.* attributes where it is");
}

/// DCGM's `UUID`: `GPU-` and the bytes as lowercase hex in groups of 4-2-2-2-6 bytes.
fn dcgm_uuid(bytes: &[u8; 16]) -> String {
    let hex = |from: usize, to: usize| bytes[from..to].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0, 4),
        hex(4, 6),
        hex(6, 8),
        hex(8, 10),
        hex(10, 16)
    )
}

/// DCGM's (NVML's) `pci_bus_id`, `00000000:3B:00.0`, from the driver's `0000:3b:00.0`; `None`
/// when `driver` is not `domain:bus:device.function` in hex.
fn dcgm_pci_bus_id(driver: &str) -> Option<String> {
    let (domain, rest) = driver.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let field = |s: &str, digits: usize| {
        let hex = !s.is_empty() && s.len() <= digits && s.bytes().all(|b| b.is_ascii_hexdigit());
        hex.then(|| u32::from_str_radix(s, 16).ok()).flatten()
    };
    Some(format!(
        "{:08X}:{:02X}:{:02X}.{:X}",
        field(domain, 8)?,
        field(bus, 2)?,
        field(device, 2)?,
        field(function, 1)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_dcgms() {
        let bytes: [u8; 16] = std::array::from_fn(|i| (i as u8) * 17);
        assert_eq!(dcgm_uuid(&bytes), "GPU-00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(dcgm_pci_bus_id("0000:3b:00.0").as_deref(), Some("00000000:3B:00.0"));
        assert_eq!(dcgm_pci_bus_id("0001:c1:1f.7").as_deref(), Some("00000001:C1:1F.7"));
        for bad in ["", "3b:00.0", "0000:3b:00", "0000:3b:000.0", "0000:+b:00.0", "0000:3b:00.g"] {
            assert_eq!(dcgm_pci_bus_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn without_the_driver_the_gpu_is_unknown() {
        // The unit tests' process never loads the CUDA driver.
        assert_eq!(current_gpu(), Gpu::default());
    }
}
