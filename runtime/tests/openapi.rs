//! `docs/openapi.json` is the API's one description: the server serves it byte for byte, it names
//! every route the router answers (with the router's methods) and every problem code, each under
//! the HTTP status the code is answered with. Schemathesis (tools/check-deploy.sh) then checks
//! real answers against it.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use instinct::problem::Code;
use instinct::server::ROUTES;
use serde_json::Value;
use strum::VariantArray;

fn committed() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
    std::fs::read_to_string(path).expect("docs/openapi.json")
}

fn document() -> Value {
    serde_json::from_str(&committed()).expect("docs/openapi.json is JSON")
}

#[tokio::test]
async fn the_served_document_is_the_committed_file() {
    let addr = start(false).await;
    let reply = exchange(addr, "GET /openapi.json HTTP/1.1", b"").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert!(
        reply.body == committed().as_bytes(),
        "GET /openapi.json differs from docs/openapi.json"
    );
    assert_eq!(reply.json()["openapi"], "3.1.0");
}

/// Every problem code with the HTTP status it is answered with.
fn codes_with_status() -> BTreeMap<String, u64> {
    Code::VARIANTS
        .iter()
        .map(|c| (c.as_str().to_string(), u64::from(c.status())))
        .collect()
}

#[test]
fn every_problem_code_is_documented_under_its_status() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let codes = codes_with_status();
    let documented: BTreeSet<String> = schemas["ProblemCode"]["enum"]
        .as_array()
        .expect("ProblemCode enum")
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let known: BTreeSet<String> = codes.keys().cloned().collect();
    assert_eq!(documented, known, "ProblemCode enum vs problem.rs");

    // Each `<Name>Problem` schema pins one status and the codes answered with it.
    let mut placed = BTreeMap::new();
    for (name, schema) in schemas.as_object().unwrap() {
        if name == "Problem" || !name.ends_with("Problem") {
            continue;
        }
        let pinned = &schema["allOf"][1]["properties"];
        let status = pinned["status"]["const"].as_u64().expect("status const");
        for code in pinned["code"]["enum"].as_array().unwrap() {
            let code = code.as_str().unwrap().to_string();
            assert!(
                placed.insert(code.clone(), status).is_none(),
                "{code} is under two statuses"
            );
        }
    }
    assert_eq!(placed, codes, "codes per status: document vs problem.rs");
}

/// The methods each documented path has (`head` implied by `get`, as the server answers it).
fn documented_routes(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(path, item)| {
            let mut methods: BTreeSet<String> = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| {
                    [
                        "get", "put", "post", "delete", "options", "head", "patch", "trace",
                    ]
                    .contains(&k.as_str())
                })
                .map(|k| k.to_ascii_uppercase())
                .collect();
            if methods.contains("GET") {
                methods.insert("HEAD".into());
            }
            (path.clone(), methods)
        })
        .collect()
}

#[tokio::test]
async fn every_route_the_router_answers_is_documented() {
    let doc = document();
    let documented = documented_routes(&doc);
    let routed: BTreeMap<String, BTreeSet<String>> = ROUTES
        .iter()
        .map(|(path, methods)| {
            let methods = methods.iter().map(|m| m.as_str().to_string()).collect();
            (path.to_string(), methods)
        })
        .collect();
    assert_eq!(documented, routed, "paths and methods: document vs router");

    // And the live router agrees: documented methods are routed, others get 405 with `Allow`.
    let addr = start(true).await;
    for (path, methods) in &documented {
        for method in methods {
            let reply = exchange(addr, &format!("{method} {path} HTTP/1.1"), b"").await;
            assert!(
                reply.status != 404 && reply.status != 405,
                "{method} {path}: {}",
                reply.status
            );
        }
        let reply = exchange(addr, &format!("DELETE {path} HTTP/1.1"), b"").await;
        assert_eq!(reply.status, 405, "DELETE {path}");
        let allow: BTreeSet<String> = reply
            .header("allow")
            .unwrap()
            .split(", ")
            .map(str::to_string)
            .collect();
        assert_eq!(&allow, methods, "Allow of {path}");
    }
    let reply = exchange(addr, "GET /v2/systemone HTTP/1.1", b"").await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["code"], "not_found");
}

#[test]
fn every_reference_resolves() {
    fn walk(doc: &Value, node: &Value, missing: &mut Vec<String>) {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    let pointer = target.strip_prefix('#').unwrap_or(target);
                    if doc.pointer(pointer).is_none() {
                        missing.push(target.clone());
                    }
                }
                map.values().for_each(|v| walk(doc, v, missing));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(doc, v, missing)),
            _ => {}
        }
    }
    let doc = document();
    let mut missing = Vec::new();
    walk(&doc, &doc, &mut missing);
    assert!(missing.is_empty(), "unresolved $ref: {missing:?}");
}
