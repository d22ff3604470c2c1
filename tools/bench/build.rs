//! Compiles the etcd v3 API subset the benchmark's etcd baseline speaks (`proto/etcd/`) with the
//! vendored `protoc` (decision 002), into a tonic client on the workspace's own tonic/prost. The
//! `etcd-client` crate would need a system `protoc` at build time; see decision 031.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/etcd/rpc_subset.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
