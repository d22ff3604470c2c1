//! Generates the tonic service stubs of `topology.claims.v1` and of the admin contract against
//! the messages the core generated (`extern_path` to `topology_claims::pb`), with a vendored
//! `protoc`. Feature `client` generates the clients, `server` the server traits; the file
//! descriptor sets (for server reflection) are always written.

use std::error::Error;
use std::path::{Path, PathBuf};

const CLAIMS: (&str, &str) = (".topology.claims.v1", "::topology_claims::pb");
const ADMIN: (&str, &str) = (".topology.claims.admin.v1", "::topology_claims::pb::admin");

/// The stubs of `file` (under `proto/`) into `out`, its descriptor set into `descriptors`.
fn stubs(
    file: &str,
    out: &Path,
    descriptors: PathBuf,
    externs: &[(&str, &str)],
) -> Result<(), Box<dyn Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let include = protoc_bin_vendored::include_path()?;
    let mut config = tonic_prost_build::configure()
        .build_client(std::env::var_os("CARGO_FEATURE_CLIENT").is_some())
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        .out_dir(out)
        .file_descriptor_set_path(descriptors);
    for (proto_path, rust_path) in externs {
        config = config.extern_path(*proto_path, *rust_path);
    }
    config.compile_protos(&[root.join(file)], &[root, include])?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let claims = "topology/claims/v1/claims.proto";
    stubs(claims, &out, out.join("claims_descriptor.bin"), &[CLAIMS])?;
    // Its own directory: the admin run would otherwise overwrite the claims.v1 module above.
    let admin = out.join("admin");
    std::fs::create_dir_all(&admin)?;
    let admin_proto = "topology/claims/admin/v1/admin.proto";
    stubs(
        admin_proto,
        &admin,
        out.join("admin_descriptor.bin"),
        &[CLAIMS, ADMIN],
    )?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
