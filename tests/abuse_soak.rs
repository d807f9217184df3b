//! The short abuse soak (issue 13): a real proxy and two real CPU workers on loopback under
//! trickled, stalled, hoarding (most of a large body, then nothing), half-sent, silent and idle
//! connections, an overload burst and a worker killed and replaced, while a steady client sends
//! real requests with a 5 s deadline. The soak itself is `sieve_e2e::soak`;
//! `benches/abuse_soak.rs` runs a longer one and prints the same figures.
//!
//! Needs the embedded model in the asset cache (`scripts/test` fetches it first).

use sieve_e2e::soak::{self, SoakConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_and_two_workers_hold_their_targets_under_abuse() {
    let report = soak::run(SoakConfig::short()).await;
    let text = report.render();
    println!("{text}");
    // Each figure the targets name must have been measured, or the check below proves nothing.
    assert!(report.steady.sent >= 15, "{text}");
    assert!(report.burst.requests > 0, "{text}");
    assert_eq!(report.memory.len(), 4, "proxy, two workers and the replacement: {text}");
    for attack in sieve_e2e::abuse::Attack::ALL {
        for target in ["proxy", "worker 0"] {
            assert!(
                report.attacks.get(&(target, attack)).is_some_and(|a| a.connections > 0),
                "no {} connections to {target}: {text}",
                attack.name()
            );
        }
    }
    let failures = report.failures();
    assert!(failures.is_empty(), "targets missed:\n  - {}\n\n{text}", failures.join("\n  - "));
}
