//! Generates the gRPC bindings of the demo's sample application from `proto/` at build
//! time (protoc is required, as for `ambit-api`). Nothing generated is committed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/demo.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
