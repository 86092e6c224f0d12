//! The OpenAPI 3.1 description of the HTTP API, served at `GET /openapi.json`.
//!
//! The committed `docs/openapi.json` is the one source: it is compiled into the binary as is, and
//! `runtime/tests/openapi.rs` keeps it in step with the router ([`crate::server::ROUTES`]) and
//! with every problem code.

/// The document, byte for byte as committed.
pub const DOCUMENT: &str = include_str!("../../docs/openapi.json");
