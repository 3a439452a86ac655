//! The CUDA driver's stand-in for the tests: a library named `libcuda.so.1` (its soname, see
//! build.rs) exporting the driver functions the plugin calls at `init`, which answer for the
//! device a test made current on the calling thread (`cudaStubSetDevice`; none at first, which
//! the driver reports as `CUDA_ERROR_INVALID_CONTEXT`). Device `d` (0–7) has the PCI bus id
//! `0000:<0x3b + d>:00.0` (lowercase hex, the driver's format) and the UUID bytes `c0 da 5e 1f 00
//! d 40 00 80 00 00 00 00 00 00 d`.
//! Called on: the test threads that stand for NCCL's.
#![allow(non_snake_case)] // the driver API's names

use std::cell::Cell;
use std::ffi::{c_char, c_int};

const CUDA_SUCCESS: c_int = 0;
const CUDA_ERROR_INVALID_VALUE: c_int = 1;
const CUDA_ERROR_INVALID_DEVICE: c_int = 101;
const CUDA_ERROR_INVALID_CONTEXT: c_int = 201;
/// The devices there are.
const DEVICES: c_int = 8;

thread_local! {
    /// The device of the calling thread's current context; negative when none is current.
    static DEVICE: Cell<c_int> = const { Cell::new(-1) };
}

/// Makes `device` current on the calling thread (negative: no current context).
#[unsafe(no_mangle)]
pub extern "C" fn cudaStubSetDevice(device: c_int) {
    DEVICE.set(device);
}

/// `CUresult cuCtxGetDevice(CUdevice*)`.
///
/// # Safety
/// `device` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> c_int {
    let current = DEVICE.get();
    if current < 0 {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if device.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-NULL and writable, by the caller's contract.
    unsafe { *device = current };
    CUDA_SUCCESS
}

/// `CUresult cuDeviceGetPCIBusId(char*, int, CUdevice)`.
///
/// # Safety
/// `out` is NULL or has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(out: *mut c_char, len: c_int, device: c_int) -> c_int {
    if !(0..DEVICES).contains(&device) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let id = format!("0000:{:02x}:00.0\0", 0x3b + device);
    if out.is_null() || usize::try_from(len).unwrap_or(0) < id.len() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `out` has `len` writable bytes (caller's contract), at least the id's with its NUL.
    unsafe { std::ptr::copy_nonoverlapping(id.as_ptr().cast::<c_char>(), out, id.len()) };
    CUDA_SUCCESS
}

/// `CUresult cuDeviceGetUuid_v2(CUuuid*, CUdevice)`.
///
/// # Safety
/// `out` is NULL or a writable `CUuuid` (16 bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(out: *mut [u8; 16], device: c_int) -> c_int {
    if !(0..DEVICES).contains(&device) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = device as u8;
    // SAFETY: non-NULL and a writable `CUuuid`, by the caller's contract.
    unsafe { *out = [0xc0, 0xda, 0x5e, 0x1f, 0, d, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, d] };
    CUDA_SUCCESS
}

/// `CUresult cuDeviceGetUuid(CUuuid*, CUdevice)`: the same as `_v2` outside MIG.
///
/// # Safety
/// As [`cuDeviceGetUuid_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut [u8; 16], device: c_int) -> c_int {
    // SAFETY: the caller's contract is `_v2`'s.
    unsafe { cuDeviceGetUuid_v2(out, device) }
}
