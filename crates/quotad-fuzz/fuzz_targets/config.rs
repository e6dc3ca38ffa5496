//! libFuzzer entry point of [`quotad_fuzz::config::run`]; see scripts/fuzz.sh.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| quotad_fuzz::config::run(data));
