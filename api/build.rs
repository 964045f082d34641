//! Generates the gRPC bindings from `proto/` at build time (protoc is required; the test
//! script installs Debian's `protobuf-compiler`). Nothing generated is committed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/identity.proto",
        "proto/discovery.proto",
        "proto/policy.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
