//! The shipped configs stay valid: the documented proxy config, the Kubernetes proxy config,
//! and the demo request.

use std::path::PathBuf;

use sieve_shared::proxy_config::{PolicyKind, SplitMode};
use sieve_shared::{Limits, ProxyConfig, ScoreRequest};

fn configs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

#[test]
fn the_documented_config_is_the_default_plus_one_worker() {
    let text = std::fs::read_to_string(configs().join("proxy.toml")).unwrap();
    let cfg = ProxyConfig::from_toml(&text).unwrap();
    // Every value it shows is the default: the file documents the defaults.
    let expected = ProxyConfig { workers: cfg.workers.clone(), ..ProxyConfig::default() };
    assert_eq!(cfg, expected);
    assert_eq!(cfg.workers.len(), 1);
    assert_eq!(cfg.workers[0].admin.as_deref(), Some("http://127.0.0.1:9081"));
}

#[test]
fn the_kubernetes_proxy_config_discovers_workers_by_dns() {
    let yaml = std::fs::read_to_string(configs().join("k8s/proxy.yaml")).unwrap();
    // The TOML block under `proxy.toml: |`, dedented.
    let mut lines = yaml.lines().skip_while(|l| !l.trim_start().starts_with("proxy.toml: |")).skip(1);
    let first = lines.next().unwrap();
    let indent = first.len() - first.trim_start().len();
    let mut toml = String::from(first.trim_start());
    toml.push('\n');
    for l in lines {
        if !l.trim().is_empty() && l.len() - l.trim_start().len() < indent {
            break;
        }
        toml.push_str(l.get(indent..).unwrap_or(""));
        toml.push('\n');
    }
    let cfg = ProxyConfig::from_toml(&toml).unwrap();
    assert_eq!(cfg.discovery.dns.len(), 1);
    assert_eq!(cfg.discovery.dns[0].name, "sieve-worker.sieve.svc.cluster.local");
    assert_eq!((cfg.discovery.dns[0].port, cfg.discovery.dns[0].admin_port), (8081, 9081));
    assert_eq!(cfg.balance.policy, PolicyKind::PowerOfTwo);
    assert_eq!(cfg.split.mode, SplitMode::Cost);
    assert_eq!(cfg.server.host, "0.0.0.0");
    // The gRPC API is on, on the port the Deployment, Service and NetworkPolicy expose.
    let port = cfg.grpc.port.expect("[grpc] port");
    for exposed in [
        format!("containerPort: {port}"),
        format!("port: {port}, targetPort: grpc"),
        format!("port: {port}, protocol: TCP"),
    ] {
        assert!(yaml.contains(&exposed), "k8s/proxy.yaml lacks {exposed:?}");
    }
}

#[test]
fn the_demo_request_is_a_valid_realistic_call() {
    let text = std::fs::read_to_string(configs().join("demo-request.json")).unwrap();
    let req: ScoreRequest = serde_json::from_str(&text).unwrap();
    Limits::default().check(&req).unwrap();
    assert!((15..=30).contains(&req.items.len()));
    assert!(req.items.iter().all(|i| i.id().is_some()));
}
