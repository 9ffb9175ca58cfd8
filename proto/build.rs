//! Compiles the protos with protox (pure Rust), so no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["edge/engine/v1/engine.proto", "edge/cache/v1/cache.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
