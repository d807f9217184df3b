//! Loading the config: the TOML file (every field defaulted), then command-line overrides.
//! The same function runs on every hot reload, so overrides keep winning.

use std::path::Path;

use sieve_shared::ProxyConfig;

/// Command-line values that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub admin_host: Option<String>,
    pub admin_port: Option<u16>,
    /// `--grpc-port`: serve the gRPC API on this port.
    pub grpc_port: Option<u16>,
}

impl Overrides {
    pub fn apply(&self, cfg: &mut ProxyConfig) {
        if let Some(h) = &self.host {
            cfg.server.host = h.clone();
        }
        if let Some(p) = self.port {
            cfg.server.port = p;
        }
        if let Some(h) = &self.admin_host {
            cfg.server.admin_host = h.clone();
        }
        if let Some(p) = self.admin_port {
            cfg.server.admin_port = p;
        }
        if let Some(p) = self.grpc_port {
            cfg.grpc.port = Some(p);
        }
    }
}

pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<ProxyConfig, String> {
    let mut cfg = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            ProxyConfig::from_toml(&text).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => ProxyConfig::default(),
    };
    overrides.apply(&mut cfg);
    Ok(cfg)
}
