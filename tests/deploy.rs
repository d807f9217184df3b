//! The deployable image and its manifests, offline and without a container runtime:
//!
//! - the `Dockerfile`: every `FROM` is a pinned digest (`name:tag@sha256:<64 hex>`) or an
//!   earlier stage; the `cpu` and `cuda` targets exist; every `scripts/...` it runs exists and is
//!   executable, and each `fetch-assets` asset it names is one the script knows; it builds with
//!   `cargo build --release --locked` the packages whose binaries it installs;
//! - `configs/k8s/*.yaml`: every image a manifest runs is a Dockerfile target (`sieve` = `cpu`,
//!   `sieve-cuda` = `cuda`) and the kustomization sets it, every command is a binary the image
//!   installs, and every resource validates against Kubernetes' own schemas in strict mode
//!   (`kubernetes-validate`, whose schemas are in the package: the venv of `scripts/fetch-assets
//!   py`, no network).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The Dockerfile's instructions: continuation lines joined, comments dropped.
fn instructions(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    out
}

/// `name:tag@sha256:<64 lowercase hex>`.
fn pinned(image: &str) -> bool {
    let Some((name_tag, digest)) = image.split_once("@sha256:") else { return false };
    let tagged = name_tag.rsplit_once(':').is_some_and(|(n, t)| !n.is_empty() && !t.is_empty() && !t.contains('/'));
    tagged && digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Stage name → base, in order; panics on an unpinned base.
fn stages(ins: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![];
    for i in ins.iter().filter(|i| i.starts_with("FROM ")) {
        let words: Vec<&str> = i.split_whitespace().collect();
        let (base, name) = match words.as_slice() {
            ["FROM", base, as_kw, name] if as_kw.eq_ignore_ascii_case("as") => (*base, *name),
            _ => panic!("every FROM names its stage (`FROM base AS name`): {i}"),
        };
        let earlier = out.iter().any(|(n, _)| n == base);
        assert!(
            earlier || pinned(base),
            "FROM {base}: not pinned by digest (name:tag@sha256:...) nor an earlier stage"
        );
        out.push((name.to_string(), base.to_string()));
    }
    out
}

/// The assets `scripts/fetch-assets` knows (the arms of its `case`).
fn known_assets() -> BTreeSet<String> {
    let script = read("scripts/fetch-assets");
    let known = script.split("(known: ").nth(1).expect("the script lists its assets").split(')').next().unwrap();
    known.split_whitespace().map(String::from).collect()
}

/// What the Dockerfile installs into the image's bin folder (`install ... target/release/NAME`).
fn installed_binaries(ins: &[String]) -> BTreeSet<String> {
    ins.iter()
        .flat_map(|i| i.split_whitespace())
        .filter_map(|w| w.strip_prefix("target/release/"))
        .map(String::from)
        .collect()
}

fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[test]
fn the_dockerfile_pins_its_bases_and_runs_the_project_s_own_steps() {
    let ins = instructions(&read("Dockerfile"));
    let stages = stages(&ins);
    let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
    for target in ["cpu", "cuda"] {
        assert!(names.contains(&target), "no `{target}` target in {names:?}");
    }
    assert!(stages.iter().filter(|(_, b)| pinned(b)).count() >= 3, "a build base and two runtime bases: {stages:?}");
    let known = known_assets();
    let mut scripts = 0;
    for i in ins.iter().filter(|i| i.starts_with("RUN ")) {
        let words: Vec<&str> = i.split_whitespace().collect();
        for (k, w) in words.iter().enumerate() {
            if let Some(rel) = w.strip_prefix("scripts/") {
                scripts += 1;
                let path = repo().join("scripts").join(rel);
                assert!(executable(&path), "{i}: {} is not an executable script of the repo", path.display());
                if rel == "fetch-assets" {
                    let args = words[k + 1..].iter().take_while(|a| !a.starts_with('&') && !a.starts_with('-'));
                    for a in args {
                        assert!(known.contains(*a), "{i}: fetch-assets knows no asset {a:?} ({known:?})");
                    }
                }
            }
        }
    }
    assert!(scripts >= 2, "the build runs scripts/fetch-assets");
    let cargo = ins.iter().find(|i| i.contains("cargo build")).expect("a cargo build");
    for flag in ["--release", "--locked"] {
        assert!(cargo.contains(flag), "{cargo}: no {flag}");
    }
    // Each installed binary is a bin target of a package the build names.
    let bins = installed_binaries(&ins);
    let of_package =
        BTreeMap::from([("sieve", "sieve-proxy"), ("sieve-proxy", "sieve-proxy"), ("sieve-worker", "sieve-worker")]);
    assert_eq!(bins, of_package.keys().map(|s| s.to_string()).collect(), "the binaries the image installs");
    for package in of_package.values() {
        assert!(cargo.contains(&format!("-p {package}")), "{cargo}: does not build {package}");
    }
    // The build context leaves out build outputs and the local asset cache.
    let ignore = read(".dockerignore");
    for p in ["/target", "/.cache", "/.git"] {
        assert!(ignore.lines().any(|l| l.trim() == p), ".dockerignore does not leave out {p}");
    }
}

#[test]
fn pinning_is_checked_for_real() {
    assert!(pinned("debian:bookworm-slim@sha256:7b140f374b289a7c2befc338f42ebe6441b7ea838a042bbd5acbfca6ec875818"));
    assert!(!pinned("debian:bookworm-slim"));
    assert!(!pinned("debian@sha256:7b140f374b289a7c2befc338f42ebe6441b7ea838a042bbd5acbfca6ec875818"), "no tag");
    assert!(!pinned("debian:bookworm-slim@sha256:7b14"), "a short digest");
    let unpinned = instructions("FROM rust:1 AS build\n");
    assert!(std::panic::catch_unwind(|| stages(&unpinned)).is_err());
    let joined = instructions("RUN a \\\n  && b\n# c\nFROM x AS y\n");
    assert_eq!(joined, ["RUN a  && b", "FROM x AS y"]);
}

/// The `image:` and the first word of `command:` of every container in the manifests.
fn containers() -> Vec<(String, String, String)> {
    let mut out = vec![];
    for file in ["proxy.yaml", "worker.yaml"] {
        let text = read(&format!("configs/k8s/{file}"));
        let mut image = None;
        for line in text.lines().map(str::trim) {
            if let Some(i) = line.strip_prefix("image: ") {
                image = Some(i.trim().to_string());
            }
            if let Some(c) = line.strip_prefix("command: [\"") {
                let i = image.take().unwrap_or_else(|| panic!("{file}: a command before its image"));
                out.push((file.to_string(), i, c.split('"').next().unwrap().to_string()));
            }
        }
    }
    out
}

#[test]
fn the_manifests_run_what_the_dockerfile_builds_and_validate_against_kubernetes_schemas() {
    let ins = instructions(&read("Dockerfile"));
    let targets: BTreeSet<String> = stages(&ins).into_iter().map(|(n, _)| n).collect();
    let bins = installed_binaries(&ins);
    let kustomization = read("configs/k8s/kustomization.yaml");
    let found = containers();
    assert_eq!(found.len(), 2, "a proxy and a worker container: {found:?}");
    for (file, image, command) in &found {
        let target = match image.as_str() {
            "sieve" => "cpu",
            "sieve-cuda" => "cuda",
            other => panic!("{file}: image {other} is built by no Dockerfile target"),
        };
        assert!(targets.contains(target), "{file}: {image} needs the `{target}` target");
        assert!(bins.contains(command), "{file}: {command} is not a binary the image installs ({bins:?})");
        assert!(kustomization.contains(&format!("- name: {image}\n")), "the kustomization does not set {image}");
    }
    assert!(found.iter().any(|(f, i, _)| f == "worker.yaml" && i == "sieve-cuda"), "workers run on the GPU image");

    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cache = std::env::var_os("SIEVE_CACHE").map_or_else(|| repo.join(".cache"), PathBuf::from);
    let validate = cache.join("py/bin/kubernetes-validate");
    assert!(validate.exists(), "{} is missing: the venv is made by `scripts/fetch-assets py`", validate.display());
    let files: Vec<PathBuf> =
        ["namespace.yaml", "proxy.yaml", "worker.yaml"].iter().map(|f| repo.join("configs/k8s").join(f)).collect();
    let out = std::process::Command::new(&validate)
        .args(["--strict", "--kubernetes-version", "1.33.0"])
        .args(&files)
        .output()
        .expect("kubernetes-validate runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the manifests do not validate:\n{text}");
    // Every resource was checked (a file it could not read would pass silently otherwise).
    let passed = text.lines().filter(|l| l.contains(" passed for resource ")).count();
    assert_eq!(passed, 9, "{text}");

    // And a manifest with a misspelt field fails: the check can fail.
    let dir = std::env::temp_dir().join(format!("sieve-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, read("configs/k8s/worker.yaml").replace("containerPort: 8081", "containerPorts: 8081"))
        .unwrap();
    let out = std::process::Command::new(&validate).args(["--strict", "--quiet"]).arg(&bad).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success(), "a misspelt field passed: {}", String::from_utf8_lossy(&out.stdout));
}
