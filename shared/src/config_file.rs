//! Reading a binary's TOML config. Every config struct denies unknown fields, so a misspelt or
//! retired key is an error rather than a silent default; this turns serde's "unknown field"
//! into a message an operator can act on: the key, its section, its line, and for a key removed
//! on purpose, that it was removed and why.

use serde::de::DeserializeOwned;

/// A key that existed once and was removed on purpose: its section (as in the header, without
/// brackets), its name, and what to do instead.
pub struct Removed {
    pub section: &'static str,
    pub key: &'static str,
    pub note: &'static str,
}

/// Keys removed from the sections every process shares (`[grpc]`, `[http]`): refused by every
/// binary's config, on top of its own list.
const SHARED_REMOVED: &[Removed] = &[
    Removed { section: "grpc", key: "inline_streams", note: "tonic's server runs each call on its own task" },
    Removed { section: "grpc", key: "poll_rounds", note: "tonic's server runs each call on its own task" },
    Removed { section: "grpc", key: "read_buffer_bytes", note: "tonic's server reads the socket itself" },
    Removed { section: "grpc", key: "write_buffer_bytes", note: "tonic's server writes the socket itself" },
];

/// Parses `text` as a `T`, naming an unknown key with its section (see the module doc).
pub fn parse<T: DeserializeOwned>(text: &str, removed: &[Removed]) -> Result<T, String> {
    toml::from_str(text).map_err(|e| explain(text, &e, removed))
}

fn explain(text: &str, e: &toml::de::Error, removed: &[Removed]) -> String {
    // serde's wording for `deny_unknown_fields`: "unknown field `KEY`, expected ...".
    let Some((key, expected)) = e.message().strip_prefix("unknown field `").and_then(|r| r.split_once('`')) else {
        return e.to_string();
    };
    // ", expected one of `a`, `b`": the keys the section does know.
    let expected = expected.replacen(", ", "; ", 1);
    let Some(at) = e.span().map(|s| s.start) else {
        return format!("`{key}` is not a known setting{expected}");
    };
    let line = text[..at].matches('\n').count() + 1;
    let section = section_at(text, at);
    let place = if section.is_empty() { "at the top level".to_string() } else { format!("in [{section}]") };
    match removed.iter().chain(SHARED_REMOVED).find(|r| r.key == key && r.section == section) {
        Some(r) => format!("`{key}` {place} (line {line}) was removed: {}; delete it", r.note),
        None => format!("`{key}` {place} (line {line}) is not a known setting{expected}"),
    }
}

/// The table the key at byte `at` belongs to: the last `[header]` or `[[header]]` above it,
/// joined with the dotted parts written before the key on its own line (`server.port = 1`).
fn section_at(text: &str, at: usize) -> String {
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let header = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .and_then(|l| l.trim_start_matches('[').split(']').next())
        .map(str::trim)
        .unwrap_or("");
    let dotted = text[line_start..at].trim().trim_end_matches('.');
    [header, dotted].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join(".")
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Default, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Config {
        server: Server,
        items: Vec<Server>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Server {
        port: u16,
    }

    const REMOVED: &[Removed] = &[Removed { section: "server", key: "threads", note: "one runtime serves all" }];

    fn err(text: &str) -> String {
        parse::<Config>(text, REMOVED).unwrap_err()
    }

    #[test]
    fn an_unknown_key_is_named_with_its_section_and_line() {
        let e = err("# comment\n[server]\nport = 1\nprot = 2\n");
        assert!(e.starts_with("`prot` in [server] (line 4) is not a known setting"), "{e}");
        assert!(e.contains("`port`"), "the known keys are listed: {e}");
        let e = err("[[items]]\nport = 1\n[[items]]\nportt = 2\n");
        assert!(e.starts_with("`portt` in [items] (line 4) is not a known setting"), "{e}");
        let e = err("colour = 1\n");
        assert!(e.starts_with("`colour` at the top level (line 1) is not a known setting"), "{e}");
        let e = err("server.prot = 1\n");
        assert!(e.starts_with("`prot` in [server] (line 1)"), "{e}");
    }

    #[test]
    fn a_removed_key_says_it_was_removed() {
        let e = err("[server]\nthreads = 4\n");
        assert_eq!(e, "`threads` in [server] (line 2) was removed: one runtime serves all; delete it");
        // The same name elsewhere is only unknown.
        assert!(err("threads = 4\n").contains("is not a known setting"));
    }

    #[test]
    fn other_errors_are_toml_s_own() {
        let e = err("[server]\nport = \"x\"\n");
        assert!(e.contains("invalid type"), "{e}");
        assert!(parse::<Config>("[server]\nport = 3\n", REMOVED).is_ok());
    }

    /// Keys removed from a section every process shares are named as removed, whatever the
    /// caller's own list.
    #[test]
    fn a_removed_grpc_key_says_it_was_removed() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct WithGrpc {
            #[allow(dead_code)]
            grpc: crate::grpc_config::GrpcConfig,
        }
        for key in ["inline_streams", "poll_rounds", "read_buffer_bytes", "write_buffer_bytes"] {
            let e = parse::<WithGrpc>(&format!("[grpc]\nport = 1\n{key} = 4\n"), &[]).unwrap_err();
            assert!(e.starts_with(&format!("`{key}` in [grpc] (line 3) was removed: tonic's server")), "{e}");
        }
    }
}
