//! libFuzzer entry point of [`quotad_fuzz::rls::run`]; see scripts/fuzz.sh.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| quotad_fuzz::rls::run(data));
