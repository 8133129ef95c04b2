#![no_main]

use libfuzzer_sys::fuzz_target;

// The checks are shared with the property tests; each target uses the one of its input kind.
#[allow(dead_code)]
#[path = "../../crates/cairn/tests/support/hostile.rs"]
mod hostile;

fuzz_target!(|data: &[u8]| {
    hostile::check_config(data);
});
