//! Loading the config: the TOML file (every field defaulted), then command-line overrides.
//! The same function runs on every hot reload, so overrides keep winning.

use std::path::Path;

use sieve_server::cli::PortTargets;
use sieve_shared::ProxyConfig;

/// Command-line values that override the file: the listening flags every server takes.
pub type Overrides = sieve_server::cli::PortFlags;

fn apply(overrides: &Overrides, cfg: &mut ProxyConfig) {
    overrides.apply(PortTargets {
        host: &mut cfg.server.host,
        port: &mut cfg.server.port,
        admin_host: &mut cfg.server.admin_host,
        admin_port: &mut cfg.server.admin_port,
        grpc_port: &mut cfg.grpc.port,
    });
}

pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<ProxyConfig, String> {
    let mut cfg = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            ProxyConfig::from_toml(&text).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => ProxyConfig::default(),
    };
    apply(overrides, &mut cfg);
    Ok(cfg)
}
