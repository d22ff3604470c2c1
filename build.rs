//! Generates the protobuf **messages** of `proto/topology/claims/v1/claims.proto` and of the admin
//! contract (`proto/topology/claims/admin/v1/admin.proto`) with a vendored `protoc`, so a fresh
//! machine needs no system protobuf compiler. Messages only: the tonic service stubs are
//! `topology-claims-proto`'s, generated against these types (decision 105).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let include = protoc_bin_vendored::include_path()?;
    let include = include.to_str().ok_or("protoc include path is not UTF-8")?;
    prost_build::Config::new().compile_protos(
        &["proto/topology/claims/v1/claims.proto"],
        &["proto", include],
    )?;
    // The admin contract refers to claims.v1 messages: those are the ones generated above.
    // Its own directory: this run would otherwise overwrite the claims.v1 module above.
    let admin_dir = out_dir.join("admin");
    std::fs::create_dir_all(&admin_dir)?;
    prost_build::Config::new()
        .out_dir(&admin_dir)
        .extern_path(".topology.claims.v1", "crate::pb")
        .compile_protos(
            &["proto/topology/claims/admin/v1/admin.proto"],
            &["proto", include],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
