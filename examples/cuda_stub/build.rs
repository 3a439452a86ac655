//! Names the library `libcuda.so.1` (`DT_SONAME`), as the CUDA driver is named: once loaded by
//! path, `dlopen("libcuda.so.1", RTLD_NOLOAD)` finds it.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
