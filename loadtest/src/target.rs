//! The server under test: a base URL that must point at this machine.
//!
//! Load is only ever sent to loopback addresses (127.0.0.0/8, ::1, or `localhost` when it resolves
//! to loopback only). Anything else is refused before a single byte is sent.

use std::net::IpAddr;

use hyper::Uri;

/// Why a target URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("target {url:?} is not a valid URL: {reason}")]
    Invalid { url: String, reason: String },
    #[error("target {url:?}: only plain http:// is supported (got scheme {scheme:?})")]
    Scheme { url: String, scheme: String },
    #[error(
        "target {url:?} refused: host {host:?} is not a loopback address; the load tester only \
         sends traffic to 127.0.0.0/8, ::1 or localhost"
    )]
    NotLoopback { url: String, host: String },
    #[error("target {url:?}: could not resolve {host:?}: {reason}")]
    Resolve {
        url: String,
        host: String,
        reason: String,
    },
}

/// A validated loopback base URL, e.g. `http://127.0.0.1:8000` (an optional path prefix is kept).
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port` with no trailing slash.
    origin: String,
    /// Path prefix without trailing slash ("" when none).
    prefix: String,
}

impl Target {
    /// Parses `url` and checks that its host is loopback. `localhost` is resolved, and every
    /// address it resolves to must be loopback.
    pub async fn parse(url: &str) -> Result<Self, TargetError> {
        let uri: Uri =
            url.parse()
                .map_err(|e: hyper::http::uri::InvalidUri| TargetError::Invalid {
                    url: url.to_string(),
                    reason: e.to_string(),
                })?;
        let scheme = uri.scheme_str().unwrap_or("");
        if scheme != "http" {
            return Err(TargetError::Scheme {
                url: url.to_string(),
                scheme: scheme.to_string(),
            });
        }
        let authority = uri.authority().ok_or_else(|| TargetError::Invalid {
            url: url.to_string(),
            reason: "no host".to_string(),
        })?;
        if authority.as_str().contains('@') {
            return Err(TargetError::Invalid {
                url: url.to_string(),
                reason: "credentials in the URL are not supported".to_string(),
            });
        }
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(80);
        check_loopback_host(url, host, port).await?;
        let prefix = uri.path().trim_end_matches('/').to_string();
        if uri.query().is_some() {
            return Err(TargetError::Invalid {
                url: url.to_string(),
                reason: "a query string is not allowed in the base URL".to_string(),
            });
        }
        Ok(Self {
            origin: format!("http://{authority}"),
            prefix,
        })
    }

    /// Full URI of `path` (which starts with '/') on this target.
    pub fn uri(&self, path: &str) -> Uri {
        format!("{}{}{}", self.origin, self.prefix, path)
            .parse()
            .expect("a validated origin plus a static path is a valid URI")
    }

    /// The base URL as given (normalised), for reports.
    pub fn base_url(&self) -> String {
        format!("{}{}", self.origin, self.prefix)
    }
}

async fn check_loopback_host(url: &str, host: &str, port: u16) -> Result<(), TargetError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return if ip.is_loopback() {
            Ok(())
        } else {
            Err(TargetError::NotLoopback {
                url: url.to_string(),
                host: host.to_string(),
            })
        };
    }
    if !bare.eq_ignore_ascii_case("localhost") {
        return Err(TargetError::NotLoopback {
            url: url.to_string(),
            host: host.to_string(),
        });
    }
    // `localhost` could be remapped in /etc/hosts: every address must still be loopback.
    let addrs: Vec<_> = tokio::net::lookup_host((bare, port))
        .await
        .map_err(|e| TargetError::Resolve {
            url: url.to_string(),
            host: host.to_string(),
            reason: e.to_string(),
        })?
        .collect();
    if addrs.is_empty() || addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(TargetError::NotLoopback {
            url: url.to_string(),
            host: format!("{host} (resolves to {addrs:?})"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loopback_targets_are_accepted() {
        for url in [
            "http://127.0.0.1:8000",
            "http://127.3.4.5:1/",
            "http://[::1]:8080",
            "http://localhost:9000/prefix/",
        ] {
            assert!(Target::parse(url).await.is_ok(), "{url}");
        }
        let t = Target::parse("http://localhost:9000/prefix/")
            .await
            .unwrap();
        assert_eq!(
            t.uri("/v1/systemone").to_string(),
            "http://localhost:9000/prefix/v1/systemone"
        );
    }

    #[tokio::test]
    async fn non_loopback_targets_are_refused() {
        for url in [
            "http://10.0.0.1:8000",
            "http://192.168.1.2",
            "http://8.8.8.8:80",
            "http://[2001:db8::1]:80",
            "http://0.0.0.0:8000",
            "http://example.com",
            "http://localhost.example.com",
        ] {
            let err = Target::parse(url).await.unwrap_err();
            assert!(
                matches!(err, TargetError::NotLoopback { .. }),
                "{url}: {err}"
            );
            assert!(err.to_string().contains("not a loopback"), "{err}");
        }
        assert!(matches!(
            Target::parse("https://127.0.0.1:8000").await,
            Err(TargetError::Scheme { .. })
        ));
        assert!(Target::parse("not a url").await.is_err());
    }
}
