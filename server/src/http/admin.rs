//! `[admin]`: who may use an admin port. State-changing routes (`POST /reload`, `POST /drain`,
//! `PUT /sim`) need `Authorization: Bearer <token>`; with `protect_reads` every route does. The
//! token comes from a file or the `SIEVE_ADMIN_TOKEN` environment variable, never from the
//! command line (where any local user could read it in the process list). Compared in constant
//! time (`subtle`), so the answer's timing does not tell how much of a guess was right.

use std::path::Path;

use hyper::header::AUTHORIZATION;
use hyper::Request;
use sieve_shared::http_config::AdminConfig;
use sieve_shared::{ApiError, ErrorKind};
use subtle::ConstantTimeEq;

/// The environment variable read when `token_file` is empty.
pub const TOKEN_ENV: &str = "SIEVE_ADMIN_TOKEN";

/// The loaded admin policy of one process.
#[derive(Clone, Default)]
pub struct AdminAuth {
    token: Option<Vec<u8>>,
    protect_reads: bool,
}

impl std::fmt::Debug for AdminAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("AdminAuth")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("protect_reads", &self.protect_reads)
            .finish()
    }
}

impl AdminAuth {
    /// Reads the token as `config` says (the file, else the environment).
    pub fn load(config: &AdminConfig) -> Result<Self, String> {
        let token = if config.token_file.is_empty() {
            std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
        } else {
            let p = Path::new(&config.token_file);
            let t = std::fs::read_to_string(p).map_err(|e| format!("admin.token_file {}: {e}", p.display()))?;
            let t = t.trim().to_string();
            if t.is_empty() {
                return Err(format!("admin.token_file {} is empty", p.display()));
            }
            Some(t)
        };
        if config.protect_reads && token.is_none() {
            return Err(format!("admin.protect_reads needs a token (admin.token_file or {TOKEN_ENV})"));
        }
        Ok(AdminAuth { token: token.map(String::into_bytes), protect_reads: config.protect_reads })
    }

    /// A policy with this token (tests and in-process servers).
    pub fn with_token(token: Option<&str>, protect_reads: bool) -> Self {
        AdminAuth { token: token.map(|t| t.as_bytes().to_vec()), protect_reads }
    }

    /// Whether `req` may use its route: `changes_state` routes always need the token, the
    /// others only with `protect_reads`. 401 for a missing or wrong token, 403 when none is
    /// configured.
    pub fn check<B>(&self, req: &Request<B>, changes_state: bool) -> Result<(), ApiError> {
        if !changes_state && !self.protect_reads {
            return Ok(());
        }
        let Some(token) = &self.token else {
            return Err(ApiError::new(
                ErrorKind::Forbidden,
                format!("admin token not configured: set [admin] token_file or {TOKEN_ENV} to use this route"),
            ));
        };
        let given = req.headers().get(AUTHORIZATION).and_then(|v| bearer_token(v.as_bytes()));
        match given {
            Some(g) if bool::from(g.ct_eq(token)) => Ok(()),
            Some(_) => Err(unauthorized("wrong admin token")),
            None => Err(unauthorized("this admin route needs Authorization: Bearer <admin token>")),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` value: the scheme is case-insensitive
/// (RFC 9110 11.1), and one or more spaces follow it.
fn bearer_token(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at_checked(6)?;
    (scheme.eq_ignore_ascii_case(b"bearer") && rest.first() == Some(&b' ')).then(|| rest.trim_ascii())
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(ErrorKind::Unauthorized, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(auth: Option<&str>) -> Request<()> {
        let mut b = Request::builder().uri("/drain");
        if let Some(a) = auth {
            b = b.header(AUTHORIZATION, a);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn state_changing_routes_need_the_token_reads_only_when_protected() {
        let a = AdminAuth::with_token(Some("s3cret"), false);
        assert!(a.check(&req(None), false).is_ok(), "reads are open by default");
        assert_eq!(a.check(&req(None), true).unwrap_err().status(), 401);
        assert_eq!(a.check(&req(Some("Bearer nope")), true).unwrap_err().status(), 401);
        assert_eq!(a.check(&req(Some("Basic s3cret")), true).unwrap_err().status(), 401);
        assert!(a.check(&req(Some("Bearer s3cret")), true).is_ok());
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            assert!(a.check(&req(Some(&format!("{scheme} s3cret"))), true).is_ok(), "{scheme}");
        }
        for bad in ["Bearers3cret", "Bearer", "Bearer  ", "Bear s3cret"] {
            assert_eq!(a.check(&req(Some(bad)), true).unwrap_err().status(), 401, "{bad:?}");
        }
        let p = AdminAuth::with_token(Some("s3cret"), true);
        assert_eq!(p.check(&req(None), false).unwrap_err().status(), 401);
        assert!(p.check(&req(Some("Bearer s3cret")), false).is_ok());
        let none = AdminAuth::default();
        assert_eq!(none.check(&req(Some("Bearer s3cret")), true).unwrap_err().status(), 403);
        assert!(!format!("{a:?}").contains("s3cret"));
    }

    #[test]
    fn the_token_comes_from_its_file_and_bad_setups_are_refused() {
        let dir = std::env::temp_dir().join(format!("sieve-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "  tok\n").unwrap();
        let a = AdminAuth::load(&AdminConfig { token_file: f.display().to_string(), protect_reads: true }).unwrap();
        assert!(a.check(&req(Some("Bearer tok")), false).is_ok());
        std::fs::write(&f, "\n").unwrap();
        assert!(AdminAuth::load(&AdminConfig { token_file: f.display().to_string(), protect_reads: false })
            .unwrap_err()
            .contains("empty"));
        let missing = AdminConfig { token_file: dir.join("nope").display().to_string(), protect_reads: false };
        assert!(AdminAuth::load(&missing).unwrap_err().contains("admin.token_file"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
