//! Every seed and every saved regression input, through its target, in
//! the ordinary test suite: a fixed bug stays fixed without a fuzzer.
//!
//! Regression inputs live in `regressions/<target>/`, one file per input
//! that once broke a rule (the file name says which); seeds in
//! `seeds/<target>/` are written by `examples/seeds.rs`.

use std::path::{Path, PathBuf};

use prost::Message;
use quotad_proto::v1 as pb;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for dir in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a readable corpus directory").path();
            let bytes = std::fs::read(&path).expect("a readable corpus file");
            found.push((path, bytes));
        }
    }
    found.sort();
    found
}

fn run_all(target: &str, run: fn(&[u8])) -> usize {
    let inputs = inputs(target);
    for (path, bytes) in &inputs {
        eprintln!("{}", path.display());
        run(bytes);
    }
    inputs.len()
}

#[test]
fn wire_inputs_decode_or_fail_cleanly() {
    assert!(run_all("wire", quotad_fuzz::wire::run) >= 20);
}

#[test]
fn server_inputs_get_a_decision_or_a_named_refusal() {
    assert!(run_all("server", quotad_fuzz::server::run) >= 40);
}

#[test]
fn config_inputs_load_or_name_the_field() {
    assert!(run_all("config", quotad_fuzz::config::run) >= 5);
}

#[test]
fn rls_inputs_load_and_resolve_to_valid_items() {
    assert!(run_all("rls", quotad_fuzz::rls::run) >= 2);
}

#[test]
fn decide_inputs_keep_every_decision_rule() {
    assert!(run_all("decide", quotad_fuzz::decide::run) >= 4);
}

#[test]
fn store_inputs_keep_the_store_exact_and_bounded() {
    assert!(run_all("store", quotad_fuzz::store::run) >= 4);
}

#[test]
fn the_request_seeds_are_requests() {
    // Seeds that no longer decode would start the fuzzer from garbage.
    for (path, bytes) in inputs("server") {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let body = &bytes[1..];
        let decodes = match bytes[0] % 4 {
            1 => pb::CheckBatchRequest::decode(body).is_ok(),
            3 => pb::ResetRequest::decode(body).is_ok(),
            _ => pb::CheckRequest::decode(body).is_ok(),
        };
        assert!(decodes || name.contains("regression"), "{}", path.display());
    }
}

#[test]
fn the_repository_configurations_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for file in ["config/quotad.example.toml", "deploy/quotad.toml"] {
        let text = std::fs::read_to_string(root.join(file)).expect("the file is in the repository");
        quotad::Config::from_toml(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        quotad_fuzz::config::run(text.as_bytes());
    }
}

#[test]
fn the_fuzzed_server_answers_a_real_check_with_a_decision() {
    let request = pb::CheckRequest {
        key: "probe".to_owned(),
        cost: None,
        policy: Some(pb::check_request::Policy::PolicyName("fixed".to_owned())),
    };
    let server = quotad_fuzz::server::Server::shared();
    let answer = server
        .call(quotad_fuzz::server::Method::Check, &request.encode_to_vec())
        .expect("a valid check is answered");
    let response = pb::CheckResponse::decode(answer.as_slice()).expect("a response");
    let decision = response.decision.expect("a decision");
    assert!(decision.allowed);
    assert_eq!(decision.limit, 10);

    let garbage = server.call(quotad_fuzz::server::Method::Check, &[0xff, 0xff, 0xff]);
    assert_eq!(
        garbage.expect_err("garbage is refused").code(),
        tonic::Code::InvalidArgument
    );
}
