//! Compiles proto/mmk/v1/*.proto and the kubelet APIs mmkd speaks (proto/k8s/) with protox
//! (no system protoc), generates the tonic code, and writes the file descriptor set of
//! mmk.v1 that server reflection serves.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/mmk/v1/mmk.proto",
        "proto/k8s/deviceplugin/v1beta1/api.proto",
        "proto/k8s/podresources/v1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mmk = protox::compile(&protos[..1], ["proto"])?;
    std::fs::write(out.join("mmk_v1_descriptor.bin"), mmk.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(protos, ["proto"])?)?;
    Ok(())
}
