#![no_main]

use cairn::storage::format::FileKind;
use libfuzzer_sys::fuzz_target;

// The checks are shared with the property tests; each target uses the one of its input kind.
#[allow(dead_code)]
#[path = "../../crates/cairn/tests/support/hostile.rs"]
mod hostile;

fuzz_target!(|data: &[u8]| {
    hostile::check_file::<cairn::checkpoint::restore::TaskStateFile>(FileKind::TaskState, data);
});
