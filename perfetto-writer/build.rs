//! Compiles the vendored Perfetto proto subset with protox (pure Rust): no protoc needed.

fn main() {
    let proto = "proto/perfetto_trace_subset.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"]).expect("compiling the Perfetto proto subset");
    prost_build::Config::new()
        .compile_fds(fds)
        .expect("generating Rust for the Perfetto proto subset");
}
