//! The stand-in answers to the same soname as CUPTI 13.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcupti.so.13");
}
