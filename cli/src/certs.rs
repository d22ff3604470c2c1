//! `topology-claims certs`: a development PKI in minutes, after `consul tls ca create` /
//! `consul tls cert create` and `cockroach cert create-ca` / `create-client`. `ca` makes the
//! signing CA; `server` a serving certificate with DNS/IP names; `client` a caller's certificate
//! whose only URI SAN is its identity, `spiffe://TRUST_DOMAIN/ROLE/NAME`.
//!
//! Owns key generation, certificate fields and writing the files (keys mode 0600, nothing
//! overwritten without --force). Must not decide what an identity may do (that is the server's
//! authorization table); production deployments bring their own PKI (see docs/security.md).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};
use topology_claims::CellId;
use topology_claims_server::auth;

#[derive(Args, Debug)]
pub struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Subcommand, Debug)]
enum CertsCommand {
    /// Create the CA: DIR/ca.pem (the certificate to give every server and client as their CA
    /// bundle) and DIR/ca-key.pem (keep it private).
    Ca(CaArgs),
    /// Create a server certificate (EKU serverAuth) signed by the CA in DIR: DIR/NAME.pem and
    /// DIR/NAME-key.pem, for `serve --tls-cert/--tls-key`.
    Server(ServerArgs),
    /// Create a client certificate (EKU clientAuth) signed by the CA in DIR, whose only URI SAN
    /// is spiffe://TRUST_DOMAIN/ROLE/NAME: DIR/ROLE-NAME.pem and DIR/ROLE-NAME-key.pem, for the
    /// clients' --tls-cert/--tls-key.
    Client(ClientArgs),
}

/// Flags every `certs` command takes.
#[derive(Args, Debug)]
struct Common {
    /// The directory of the CA and the certificates (created by `certs ca` if missing).
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_DIR", default_value = "certs")]
    dir: PathBuf,

    /// Overwrite existing files (by default an existing file is an error and nothing is
    /// written). Env: true/false, 1/0, yes/no, on/off.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_FORCE",
          value_parser = crate::env::switch)]
    force: bool,
}

#[derive(Args, Debug)]
struct CaArgs {
    #[command(flatten)]
    common: Common,

    /// The SPIFFE trust domain this CA signs for, written as the CA's URI SAN
    /// spiffe://TRUST_DOMAIN and its organization: lowercase letters, digits, '.', '-', '_'.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_TRUST_DOMAIN", default_value = auth::DEFAULT_TRUST_DOMAIN,
          value_parser = parse_trust_domain)]
    trust_domain: String,

    /// Validity of the CA certificate in days from now (1..=36500).
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_DAYS", default_value_t = 1825,
          value_parser = clap::value_parser!(u32).range(1..=36500))]
    days: u32,
}

#[derive(Args, Debug)]
struct ServerArgs {
    #[command(flatten)]
    common: Common,

    /// The file name stem and the certificate's common name: DIR/NAME.pem, DIR/NAME-key.pem
    /// ([A-Za-z0-9._-], not "ca").
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_NAME", default_value = "server",
          value_parser = parse_server_name)]
    name: String,

    /// A DNS name clients reach the server by (a DNS SAN). Repeat the flag for several; the env
    /// var takes a comma-separated list.
    #[arg(
        long = "dns",
        value_name = "HOST",
        env = "TOPOLOGY_CLAIMS_CERTS_DNS",
        value_delimiter = ',',
        default_value = "localhost"
    )]
    dns: Vec<String>,

    /// An IP address clients reach the server by (an IP SAN). Repeat the flag for several; the
    /// env var takes a comma-separated list.
    #[arg(
        long = "ip",
        value_name = "IP",
        env = "TOPOLOGY_CLAIMS_CERTS_IP",
        value_delimiter = ',',
        default_value = "127.0.0.1"
    )]
    ip: Vec<IpAddr>,

    /// Validity in days from now (1..=36500). A certificate stops verifying when its CA expires,
    /// whatever its own validity.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_DAYS", default_value_t = 365,
          value_parser = clap::value_parser!(u32).range(1..=36500))]
    days: u32,
}

/// What a client is, the second segment of its SPIFFE id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    /// A cell; NAME is its cell id.
    Cell,
    /// A request router.
    Router,
    /// An operator.
    Admin,
}

impl Role {
    /// The name the server's identity table reads (`topology_claims_server::auth`).
    fn name(self) -> &'static str {
        match self {
            Role::Cell => auth::Role::Cell,
            Role::Router => auth::Role::Router,
            Role::Admin => auth::Role::Admin,
        }
        .name()
    }
}

#[derive(Args, Debug)]
struct ClientArgs {
    #[command(flatten)]
    common: Common,

    /// The client's role: cell, router or admin. Required.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_ROLE", value_enum)]
    role: Role,

    /// The client's name: the cell id for --role cell ([A-Za-z0-9._-]). Required.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_NAME", value_parser = parse_segment)]
    name: String,

    /// The SPIFFE trust domain of the identity spiffe://TRUST_DOMAIN/ROLE/NAME: lowercase
    /// letters, digits, '.', '-', '_'. Must be the server's `serve --trust-domain`.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_TRUST_DOMAIN", default_value = auth::DEFAULT_TRUST_DOMAIN,
          value_parser = parse_trust_domain)]
    trust_domain: String,

    /// Validity in days from now (1..=36500).
    #[arg(long, env = "TOPOLOGY_CLAIMS_CERTS_DAYS", default_value_t = 365,
          value_parser = clap::value_parser!(u32).range(1..=36500))]
    days: u32,
}

fn parse_trust_domain(text: &str) -> Result<String, String> {
    let valid = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_'));
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "bad trust domain {text:?}: use lowercase letters, digits, '.', '-' and '_' (e.g. \
             topology-claims or claims.example.com)"
        ))
    }
}

/// A SPIFFE path segment, which is also a file name stem: the cell id's characters, and not a
/// relative path.
fn parse_segment(text: &str) -> Result<String, String> {
    if matches!(text, "." | "..") {
        return Err(format!("{text:?} is not a name"));
    }
    CellId::parse_field(text, "name")
        .map(|id| id.as_str().to_owned())
        .map_err(|e| e.to_string())
}

fn parse_server_name(text: &str) -> Result<String, String> {
    let name = parse_segment(text)?;
    if name == "ca" {
        return Err("\"ca\" is the CA's own file name (ca.pem); pick another".to_owned());
    }
    Ok(name)
}

pub fn run(args: CertsArgs) -> ExitCode {
    let result = match args.command {
        CertsCommand::Ca(args) => create_ca(&args),
        CertsCommand::Server(args) => create_server(&args),
        CertsCommand::Client(args) => create_client(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca-key.pem";

/// A certificate and its key about to be written.
struct Pair {
    cert: PathBuf,
    key: PathBuf,
}

impl Pair {
    fn in_dir(dir: &Path, stem: &str) -> Self {
        Self {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}-key.pem")),
        }
    }

    /// Refuses before anything is written, so a refusal leaves no half-made pair.
    fn check_free(&self, force: bool) -> Result<(), String> {
        if force {
            return Ok(());
        }
        for path in [&self.cert, &self.key] {
            if path.exists() {
                return Err(format!(
                    "{} exists; not overwriting it (pass --force to replace it)",
                    path.display()
                ));
            }
        }
        Ok(())
    }

    fn write(&self, cert_pem: &str, key: &KeyPair) -> Result<(), String> {
        write_file(&self.key, key.serialize_pem().as_bytes(), 0o600)?;
        write_file(&self.cert, cert_pem.as_bytes(), 0o644)
    }
}

/// Writes `contents` to `path` with `mode`, set before the contents go in (an existing file's mode
/// is changed too, so a replaced key is never readable by others, not even for a moment).
fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let mut file: File = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(failed)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(failed)?;
    file.write_all(contents).map_err(failed)?;
    file.sync_all().map_err(failed)
}

/// Validity from a few minutes ago (clocks of the machines that check it differ) to `days` from
/// now.
fn validity(params: &mut CertificateParams, days: u32) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(i64::from(days));
}

fn until(params: &CertificateParams) -> String {
    let date = params.not_after.date();
    format!("{date}")
}

fn uri_san(uri: &str) -> Result<SanType, String> {
    uri.try_into()
        .map(SanType::URI)
        .map_err(|e| format!("bad URI {uri:?}: {e}"))
}

fn generate_key() -> Result<KeyPair, String> {
    // ECDSA P-256 with SHA-256, rcgen's default: what rustls, Go, Java and grpcio all accept.
    KeyPair::generate().map_err(|e| format!("cannot generate a key: {e}"))
}

fn create_ca(args: &CaArgs) -> Result<(), String> {
    let dir = &args.common.dir;
    let pair = Pair {
        cert: dir.join(CA_CERT),
        key: dir.join(CA_KEY),
    };
    pair.check_free(args.common.force)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;

    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, args.trust_domain.as_str());
    // A fingerprint of the key tells two development CAs of one trust domain apart (as consul's
    // CA names carry a serial): a client trusting the other one then reports an unknown issuer
    // rather than a bad signature, and a human sees which CA signed what.
    let key = generate_key()?;
    let fingerprint: String = key
        .public_key_raw()
        .iter()
        .skip(1)
        .take(6)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    name.push(
        DnType::CommonName,
        format!(
            "topology-claims development CA {} {fingerprint}",
            args.trust_domain
        ),
    );
    params.distinguished_name = name;
    // No intermediates: every certificate `certs` makes is signed by this CA directly.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // The SPIFFE convention: a CA names the trust domain it signs for.
    params.subject_alt_names = vec![uri_san(&format!("spiffe://{}", args.trust_domain))?];
    validity(&mut params, args.days);

    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("cannot create the CA certificate: {e}"))?;
    pair.write(&cert.pem(), &key)?;
    println!(
        "wrote {} (CA certificate, trust domain {}, valid until {}; the CA bundle of servers \
         and clients)",
        pair.cert.display(),
        args.trust_domain,
        until(&params)
    );
    println!(
        "wrote {} (CA private key, mode 0600; keep it private)",
        pair.key.display()
    );
    Ok(())
}

/// The CA in `dir` as an issuer: its certificate's subject and key identifier, and its key.
fn load_ca(dir: &Path) -> Result<Issuer<'static, KeyPair>, String> {
    let read = |name: &str, what: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "cannot read the {what} {}: {e} (create the CA with `topology-claims certs ca \
                 --dir {}`)",
                path.display(),
                dir.display()
            )
        })
    };
    let cert_pem = read(CA_CERT, "CA certificate")?;
    let key_pem = read(CA_KEY, "CA key")?;
    let key = KeyPair::from_pem(&key_pem)
        .map_err(|e| format!("cannot use the CA key {}: {e}", dir.join(CA_KEY).display()))?;
    Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| {
        format!(
            "cannot use the CA certificate {}: {e}",
            dir.join(CA_CERT).display()
        )
    })
}

/// Parameters of a leaf certificate: not a CA, signatures only, one EKU.
fn leaf_params(
    name: DistinguishedName,
    eku: ExtendedKeyUsagePurpose,
    days: u32,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![eku];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, days);
    params
}

fn sign_and_write(params: &CertificateParams, dir: &Path, pair: &Pair) -> Result<(), String> {
    let issuer = load_ca(dir)?;
    let key = generate_key()?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| format!("cannot sign the certificate: {e}"))?;
    pair.write(&cert.pem(), &key)
}

fn create_server(args: &ServerArgs) -> Result<(), String> {
    let dir = &args.common.dir;
    let pair = Pair::in_dir(dir, &args.name);
    pair.check_free(args.common.force)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, args.name.as_str());
    let mut params = leaf_params(name, ExtendedKeyUsagePurpose::ServerAuth, args.days);
    for host in &args.dns {
        let san = host
            .as_str()
            .try_into()
            .map_err(|e| format!("bad --dns name {host:?}: {e}"))?;
        params.subject_alt_names.push(SanType::DnsName(san));
    }
    params
        .subject_alt_names
        .extend(args.ip.iter().copied().map(SanType::IpAddress));
    if params.subject_alt_names.is_empty() {
        return Err("a server certificate needs at least one --dns or --ip name".to_owned());
    }
    sign_and_write(&params, dir, &pair)?;
    let names: Vec<String> = args
        .dns
        .iter()
        .map(|host| format!("DNS:{host}"))
        .chain(args.ip.iter().map(|ip| format!("IP:{ip}")))
        .collect();
    println!(
        "wrote {} (server certificate for {}, valid until {})",
        pair.cert.display(),
        names.join(", "),
        until(&params)
    );
    println!(
        "wrote {} (server private key, mode 0600)",
        pair.key.display()
    );
    Ok(())
}

fn create_client(args: &ClientArgs) -> Result<(), String> {
    let dir = &args.common.dir;
    let role = args.role.name();
    let pair = Pair::in_dir(dir, &format!("{role}-{}", args.name));
    pair.check_free(args.common.force)?;
    let identity = format!("spiffe://{}/{role}/{}", args.trust_domain, args.name);
    // The subject only informs humans (O = trust domain, OU = role, CN = name); the server
    // reads the identity from the URI SAN.
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, args.trust_domain.as_str());
    name.push(DnType::OrganizationalUnitName, role);
    name.push(DnType::CommonName, args.name.as_str());
    let mut params = leaf_params(name, ExtendedKeyUsagePurpose::ClientAuth, args.days);
    // Exactly one URI SAN: the identity the server authorizes (SPIFFE X.509-SVID).
    params.subject_alt_names = vec![uri_san(&identity)?];
    sign_and_write(&params, dir, &pair)?;
    println!(
        "wrote {} (client certificate {identity}, valid until {})",
        pair.cert.display(),
        until(&params)
    );
    println!(
        "wrote {} (client private key, mode 0600)",
        pair.key.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_domains_are_lowercase_dns_like_names() {
        assert!(parse_trust_domain("topology-claims").is_ok());
        assert!(parse_trust_domain("claims.example.com").is_ok());
        assert!(parse_trust_domain("Claims").is_err());
        assert!(parse_trust_domain("a/b").is_err());
        assert!(parse_trust_domain("").is_err());
    }

    #[test]
    fn names_are_path_segments_and_never_relative_paths() {
        assert_eq!(parse_segment("cell-a").unwrap(), "cell-a");
        assert!(parse_segment("..").is_err());
        assert!(parse_segment("a/b").is_err());
        assert!(parse_segment("").is_err());
        assert!(parse_server_name("ca").is_err());
    }
}
