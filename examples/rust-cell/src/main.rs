//! `rust-cell SERVER_URL CELL_ID DB_PATH NAME EMAIL`: registers one user (see the library).

use rust_cell::signup;
use topology_claims_client::{CellId, ClaimsClient, ClientConfig, ClientTls};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [server, cell, db, name, email] = args.as_slice() else {
        eprintln!("usage: signup SERVER_URL CELL_ID DB_PATH NAME EMAIL");
        return std::process::ExitCode::from(2);
    };
    let run = async {
        // Over mutual TLS (an https:// SERVER_URL): the CA bundle and this cell's certificate.
        let tls = match (
            std::env::var_os("TOPOLOGY_CLAIMS_CLIENT_TLS_CA"),
            std::env::var_os("TOPOLOGY_CLAIMS_CLIENT_TLS_CERT"),
            std::env::var_os("TOPOLOGY_CLAIMS_CLIENT_TLS_KEY"),
        ) {
            (Some(ca), Some(cert), Some(key)) => Some(
                ClientTls::from_files(ca.as_ref(), Some((cert.as_ref(), key.as_ref())))
                    .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        let config = ClientConfig {
            tls,
            ..ClientConfig::default()
        };
        let client = ClaimsClient::connect_lazy(server, config).map_err(|e| e.to_string())?;
        let cell = CellId::parse(cell).map_err(|e| e.to_string())?;
        signup(&client, &cell, db, name, email).await
    };
    match run.await {
        Ok(id) => {
            println!("registered {name} as user {id}");
            std::process::ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("signup failed: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}
