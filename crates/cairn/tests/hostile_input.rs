//! Hostile input: frames from the network, checkpoint files and configuration, arbitrary and
//! mutated from valid encodings. Nothing may panic or allocate without bound; invalid input is
//! a clean error and valid input round-trips.
//!
//! The pass here is short; `CAIRN_FUZZ_CASES=1000000 cargo test --release -p cairn --test
//! hostile_input` soaks it. Coverage-guided fuzzing of the same inputs is in `fuzz/` (see the
//! README), whose seed corpus `CAIRN_WRITE_FUZZ_CORPUS=1` regenerates from [`seeds`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

use cairn::checkpoint::restore::TaskStateFile;
use cairn::checkpoint::CheckpointMetadata;
use cairn::cluster::frame::{read_frame, FrameError, FRAME_BYTES_MAX, PROTOCOL_VERSION};
use cairn::cluster::protocol::{DataMsg, ToCoordinator, ToWorker};
use cairn::storage::format::{decode, encode, encode_frame, FileKind, FormatError};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[path = "support/hostile.rs"]
mod hostile;
use hostile::*;

/// Counts, per thread, the largest single allocation since the last reset, so that a test can
/// tell a decoder that trusts a length field from one that does not.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// The largest single allocation `f` makes on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

/// No input of up to a few KiB may make a decoder ask for more than this in one allocation
/// (serde preallocates at most 1 MiB for a sequence whatever its length field says; a frame
/// body grows from 1 MiB with the bytes that arrive).
const ALLOCATION_BYTES_MAX: usize = 4 << 20;

fn cases() -> u32 {
    std::env::var("CAIRN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// A byte-level edit of a valid input.
#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Set {
        at: usize,
        byte: u8,
    },
    /// Writes a large little-endian length (as a length prefix or a varint would be read).
    Huge {
        at: usize,
        varint: bool,
    },
    Truncate {
        at: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Remove {
        at: usize,
        len: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        (any::<usize>(), any::<bool>()).prop_map(|(at, varint)| Mutation::Huge { at, varint }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1usize..16).prop_map(|(at, len)| Mutation::Remove { at, len }),
    ]
}

fn mutate(mut b: Vec<u8>, edits: &[Mutation]) -> Vec<u8> {
    for m in edits {
        let n = b.len();
        let pos = |at: &usize| if n == 0 { 0 } else { at % (n + 1) };
        match m {
            Mutation::Flip { at, bit } if n > 0 => b[at % n] ^= 1 << bit,
            Mutation::Set { at, byte } if n > 0 => b[at % n] = *byte,
            Mutation::Huge { at, varint } => {
                let p = pos(at).min(n);
                let huge: &[u8] = if *varint {
                    &[0xff, 0xff, 0xff, 0xff, 0x0f]
                } else {
                    &[0xff, 0xff, 0xff, 0xff]
                };
                let end = (p + huge.len()).min(n);
                b.splice(p..end, huge.iter().copied());
            }
            Mutation::Truncate { at } => b.truncate(pos(at)),
            Mutation::Insert { at, bytes } => {
                let p = pos(at);
                b.splice(p..p, bytes.iter().copied());
            }
            Mutation::Remove { at, len } => {
                let p = pos(at).min(n);
                b.drain(p..(p + len).min(n));
            }
            Mutation::Flip { .. } | Mutation::Set { .. } => {}
        }
    }
    b
}

/// Either arbitrary bytes or a seed with a few edits.
fn hostile(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..512),
        4 => (0..n, prop::collection::vec(mutation(), 1..5))
            .prop_map(move |(i, edits)| mutate(seeds[i].clone(), &edits)),
    ]
}

fn run(strategy: impl Strategy<Value = Vec<u8>>, check: impl Fn(&[u8])) {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |input| {
            let ((), largest) = largest_allocation(|| check(&input));
            prop_assert!(
                largest <= ALLOCATION_BYTES_MAX,
                "one allocation of {largest} bytes"
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn valid_frames_round_trip_exactly() {
    for seed in seeds::frames() {
        let decoded = [
            check_frame::<DataMsg>(&seed),
            check_frame::<ToWorker>(&seed),
            check_frame::<ToCoordinator>(&seed),
        ];
        assert!(decoded.contains(&Some(seed.clone())), "{seed:?}");
    }
}

#[test]
fn hostile_frames_are_errors_without_panic_or_large_allocation() {
    run(hostile(seeds::frames()), |input| {
        check_any_frame(input);
    });
}

#[test]
fn a_frame_announcing_the_maximum_and_sending_nothing_allocates_one_chunk() {
    let mut input = ((FRAME_BYTES_MAX) as u32).to_le_bytes().to_vec();
    input.extend_from_slice(&[PROTOCOL_VERSION, 0, 0]);
    let (result, largest) = largest_allocation(|| {
        let mut buf = Vec::new();
        read_frame::<_, DataMsg>(&mut &input[..], &mut buf)
    });
    assert!(
        matches!(result, Err(FrameError::Truncated { len }) if len == FRAME_BYTES_MAX),
        "{result:?}"
    );
    assert!(largest <= 1 << 20, "one allocation of {largest} bytes");
}

#[test]
fn a_batch_claiming_four_gib_is_refused_without_allocating_it() {
    // DataMsg::Frame { task: 0, channel: 0, frame: Batch(<length 2^32 - 1, no bytes>) }.
    let payload = [1u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f];
    let mut input = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
    input.push(PROTOCOL_VERSION);
    input.extend_from_slice(&payload);
    let (result, largest) = largest_allocation(|| {
        let mut buf = Vec::new();
        read_frame::<_, DataMsg>(&mut &input[..], &mut buf)
    });
    assert!(
        matches!(result, Err(FrameError::Malformed(_))),
        "{result:?}"
    );
    assert!(
        largest <= ALLOCATION_BYTES_MAX,
        "one allocation of {largest} bytes"
    );
}

#[test]
fn valid_checkpoint_files_round_trip() {
    let meta = seeds::metadata();
    assert_eq!(
        decode::<CheckpointMetadata>(
            FileKind::Metadata,
            &encode(FileKind::Metadata, &meta).unwrap()
        ),
        Ok(meta)
    );
    for (_, f) in seeds::state_files() {
        assert_eq!(
            decode::<TaskStateFile>(
                FileKind::TaskState,
                &encode(FileKind::TaskState, &f).unwrap()
            ),
            Ok(f)
        );
    }
}

#[test]
fn hostile_metadata_is_an_error_without_panic_or_large_allocation() {
    run(
        hostile(framed_payload_seeds(&[seeds::metadata()])),
        |input| {
            check_file::<CheckpointMetadata>(FileKind::Metadata, input);
        },
    );
}

#[test]
fn metadata_whose_operator_count_claims_four_gib_is_refused_without_allocating_it() {
    let mut payload = postcard::to_stdvec(&CheckpointMetadata {
        operators: Vec::new(),
        tasks: Vec::new(),
        ..seeds::metadata()
    })
    .unwrap();
    // The fields after `max_parallelism`: operators (length 0), state_size, tasks (length 0),
    // shared_files (length 0).
    let at = payload.len() - 5;
    assert_eq!(payload[at], 0, "{payload:?}");
    payload.splice(at..at + 1, [0xff, 0xff, 0xff, 0xff, 0x0f]);
    let file = encode_frame(FileKind::Metadata, &payload);
    let (result, largest) =
        largest_allocation(|| decode::<CheckpointMetadata>(FileKind::Metadata, &file));
    assert!(matches!(result, Err(FormatError::Decode(_))), "{result:?}");
    assert!(
        largest <= ALLOCATION_BYTES_MAX,
        "one allocation of {largest} bytes"
    );
}

#[test]
fn hostile_task_state_files_are_errors_without_panic_or_large_allocation() {
    let files: Vec<TaskStateFile> = seeds::state_files().into_iter().map(|(_, f)| f).collect();
    run(hostile(framed_payload_seeds(&files)), |input| {
        check_file::<TaskStateFile>(FileKind::TaskState, input);
    });
}

#[test]
fn a_valid_checkpoint_restores() {
    for seed in restore_seeds() {
        assert!(check_restore(&seed));
    }
}

#[test]
fn hostile_checkpoints_are_refused_or_restore_consistently() {
    run(hostile(restore_seeds()), |input| {
        check_restore(input);
    });
}

#[test]
fn valid_configurations_parse_and_survive_the_trip_to_a_worker() {
    for seed in config_seeds() {
        assert!(
            check_config(&seed).is_some(),
            "{}",
            String::from_utf8_lossy(&seed)
        );
    }
}

#[test]
fn hostile_configurations_are_errors_without_panic_or_large_allocation() {
    run(hostile(config_seeds()), |input| {
        check_config(input);
    });
}

/// With `CAIRN_WRITE_FUZZ_CORPUS=1`, writes the seeds into the cargo-fuzz corpus directories
/// (`fuzz/corpus/<target>/`); always checks that every seed is accepted by its target's check.
#[test]
fn fuzz_seeds_are_valid() {
    type Check = fn(&[u8]) -> bool;
    let targets: [(&str, Vec<Vec<u8>>, Check); 5] = [
        ("frame", seeds::frames(), check_any_frame),
        (
            "metadata",
            framed_payload_seeds(&[seeds::metadata()]),
            |b| check_file::<CheckpointMetadata>(FileKind::Metadata, b).is_some(),
        ),
        (
            "task_state",
            framed_payload_seeds(
                &seeds::state_files()
                    .into_iter()
                    .map(|(_, f)| f)
                    .collect::<Vec<_>>(),
            ),
            |b| check_file::<TaskStateFile>(FileKind::TaskState, b).is_some(),
        ),
        ("restore", restore_seeds(), check_restore),
        ("config", config_seeds(), |b| check_config(b).is_some()),
    ];
    let write = std::env::var_os("CAIRN_WRITE_FUZZ_CORPUS").is_some();
    for (target, seeds, check) in targets {
        for (i, seed) in seeds.iter().enumerate() {
            assert!(check(seed), "seed {i} of {target}");
            if write {
                let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../../fuzz/corpus")
                    .join(target);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(format!("seed-{i}")), seed).unwrap();
            }
        }
    }
}
