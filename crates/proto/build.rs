//! Generates the tonic service stubs of `topology.claims.v1` and of the admin contract against
//! the messages the core generated (`extern_path` to `topology_claims::pb`), with a vendored
//! `protoc`. Feature `client` generates the clients, `server` the server traits; the file
//! descriptor sets (for server reflection) are always written.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let include = protoc_bin_vendored::include_path()?;
    let include = include.to_str().ok_or("protoc include path is not UTF-8")?;
    let client = std::env::var_os("CARGO_FEATURE_CLIENT").is_some();
    let server = std::env::var_os("CARGO_FEATURE_SERVER").is_some();
    let proto = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let proto = proto.to_str().ok_or("proto path is not UTF-8")?;
    tonic_prost_build::configure()
        .build_client(client)
        .build_server(server)
        .extern_path(".topology.claims.v1", "::topology_claims::pb")
        .file_descriptor_set_path(out_dir.join("claims_descriptor.bin"))
        .compile_protos(
            &[format!("{proto}/topology/claims/v1/claims.proto").as_str()],
            &[proto, include],
        )?;
    let admin_dir = out_dir.join("admin");
    std::fs::create_dir_all(&admin_dir)?;
    tonic_prost_build::configure()
        .build_client(client)
        .build_server(server)
        .out_dir(&admin_dir)
        .extern_path(".topology.claims.v1", "::topology_claims::pb")
        .extern_path(".topology.claims.admin.v1", "::topology_claims::pb::admin")
        .file_descriptor_set_path(out_dir.join("admin_descriptor.bin"))
        .compile_protos(
            &[format!("{proto}/topology/claims/admin/v1/admin.proto").as_str()],
            &[proto, include],
        )?;
    println!("cargo:rerun-if-changed={proto}");
    Ok(())
}
