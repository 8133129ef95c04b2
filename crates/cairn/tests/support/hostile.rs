//! Valid encodings of every hostile-input kind (the seeds mutations start from) and the check
//! each kind must pass: shared by the property tests (`hostile_input.rs`) and the cargo-fuzz
//! targets (`fuzz/`), so both hold inputs to the same rules.

use std::path::PathBuf;

use cairn::checkpoint::restore::TaskStateFile;
use cairn::checkpoint::{
    load_checkpoint, CheckpointMetadata, OperatorMetadata, OperatorStates, SubtaskStateHandle,
    TaskAck, TaskCheckpointStats,
};
use cairn::cluster::frame::{read_frame, write_frame};
use cairn::cluster::protocol::{
    DataMsg, DeploySpec, ToCoordinator, ToWorker, WireEvent, WireTaskError,
};
use cairn::config::JobConfig;
use cairn::runtime::channel::{Barrier, BarrierKind, ControlMail, DataFrame};
use cairn::state::rocks::{DiskFile, DiskFileLocation};
use cairn::state::{
    ChannelStateData, DiskStateData, KeyedTableData, OperatorListData, OperatorStateData,
    SerializerId, StateDescriptor, StateKind,
};
use cairn::storage::format::{decode, encode, encode_frame, FileKind};
use cairn::storage::{CheckpointStorage, MemoryStorage};

/// Valid encodings of every input kind: the seeds mutations start from.
pub mod seeds {
    use super::*;

    fn barrier(id: u64) -> Barrier {
        Barrier {
            id,
            timestamp_ms: 1_700_000_000_000,
            aligned_only: id % 2 == 0,
            savepoint: id % 3 == 0,
        }
    }

    pub fn frames() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut push = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = Vec::new();
            f(&mut b);
            out.push(b);
        };
        let data = [
            DataMsg::Hello {
                secret: "s3cret".into(),
                job_id: "job-1".into(),
                attempt: 2,
            },
            DataMsg::Frame {
                task: 3,
                channel: 1,
                frame: DataFrame::Batch(
                    postcard::to_stdvec(&vec![("w".to_string(), 1u64)]).unwrap(),
                ),
            },
            DataMsg::Frame {
                task: 3,
                channel: 0,
                frame: DataFrame::PriorityBarrier(barrier(7), 12),
            },
            DataMsg::Frame {
                task: 0,
                channel: 2,
                frame: DataFrame::Barrier(barrier(8)),
            },
            DataMsg::Frame {
                task: 1,
                channel: 0,
                frame: DataFrame::Watermark(1_700_000_000_123),
            },
            DataMsg::Frame {
                task: 1,
                channel: 1,
                frame: DataFrame::Idle,
            },
            DataMsg::Frame {
                task: 1,
                channel: 0,
                frame: DataFrame::EndOfStream,
            },
            DataMsg::Credit {
                task: 4,
                channel: 5,
            },
        ];
        for m in &data {
            push(&|b| write_frame(b, m).unwrap());
        }
        let to_worker = [
            ToWorker::Registered {
                worker_id: 3,
                heartbeat_timeout_ms: 2000,
            },
            ToWorker::Heartbeat,
            ToWorker::Rejected {
                reason: "wrong cluster secret".into(),
            },
            ToWorker::Deploy(Box::new(DeploySpec {
                job_id: "job-1".into(),
                attempt: 1,
                job: "wordcount".into(),
                params: r#"{"generate":1000}"#.into(),
                seed: 0,
                fingerprint: "0123456789abcdef".into(),
                inject: None,
                inject_uid: None,
                checkpoint_dir: Some(PathBuf::from("/tmp/chk")),
                config_yaml: serde_norway::to_string(&JobConfig::default()).unwrap(),
                restore: None,
                assignment: vec![0, 1, 0, 1],
                deploy_mask: vec![true, true, false, true],
                workers: vec![(0, "127.0.0.1:1".into()), (1, "127.0.0.1:2".into())],
                sources_stopped: false,
            })),
            ToWorker::Mail {
                job_id: "job-1".into(),
                attempt: 1,
                task: 2,
                mail: ControlMail::Trigger(barrier(3), BarrierKind::Unaligned),
            },
            ToWorker::Mail {
                job_id: "job-1".into(),
                attempt: 1,
                task: 0,
                mail: ControlMail::Trigger(barrier(4), BarrierKind::Stop { drain: true }),
            },
            ToWorker::Mail {
                job_id: "job-1".into(),
                attempt: 1,
                task: 0,
                mail: ControlMail::Complete(3),
            },
            ToWorker::CancelAttempt {
                job_id: "job-1".into(),
                attempt: 1,
            },
            ToWorker::CheckJob(Box::new(DeploySpec {
                job_id: "job-2".into(),
                attempt: 0,
                job: "wordcount".into(),
                params: "{}".into(),
                seed: 7,
                fingerprint: "fedcba9876543210".into(),
                inject: None,
                inject_uid: None,
                checkpoint_dir: None,
                config_yaml: String::new(),
                restore: None,
                assignment: vec![0],
                deploy_mask: vec![true],
                workers: vec![(0, "127.0.0.1:1".into())],
                sources_stopped: false,
            })),
        ];
        for m in &to_worker {
            push(&|b| write_frame(b, m).unwrap());
        }
        let to_coordinator = [
            ToCoordinator::Register {
                secret: "s3cret".into(),
                slots: 2,
                data_addr: "127.0.0.1:4000".into(),
            },
            ToCoordinator::Heartbeat,
            ToCoordinator::JobChecked {
                job_id: "job-2".into(),
                attempt: 0,
                refusal: Some("worker 1 has no job 'wordcount'".into()),
            },
            ToCoordinator::Event {
                job_id: "job-1".into(),
                event: WireEvent::Ack(TaskAck {
                    checkpoint_id: 4,
                    task_index: 1,
                    attempt: 0,
                    file: Some("task-0-1".into()),
                    operators: vec![OperatorStates {
                        uid: "count".into(),
                        states: vec![StateDescriptor {
                            name: "counts".into(),
                            kind: StateKind::Value,
                            serializer: SerializerId::postcard::<u64>(),
                        }],
                    }],
                    stats: TaskCheckpointStats {
                        task: "count".into(),
                        subtask: 1,
                        state_size: 100,
                        unaligned: true,
                        ..Default::default()
                    },
                    shared_files: vec!["job-1/shared/4-00ff-000012.sst".into()],
                }),
            },
            ToCoordinator::Event {
                job_id: "job-1".into(),
                event: WireEvent::Exited {
                    attempt: 0,
                    task: 2,
                    error: Some(WireTaskError::Failed("boom".into())),
                },
            },
            ToCoordinator::AttemptCancelled {
                job_id: "job-1".into(),
                attempt: 0,
            },
        ];
        for m in &to_coordinator {
            push(&|b| write_frame(b, m).unwrap());
        }
        out
    }

    pub fn metadata() -> CheckpointMetadata {
        CheckpointMetadata {
            job_id: "job".into(),
            job_name: "wordcount".into(),
            checkpoint_id: 3,
            trigger_timestamp_ms: 10,
            completed_timestamp_ms: 20,
            max_parallelism: 8,
            operators: vec![
                OperatorMetadata {
                    uid: "count".into(),
                    parallelism: 2,
                    subtasks: vec![
                        SubtaskStateHandle {
                            subtask: 0,
                            file: "task-1-0".into(),
                        },
                        SubtaskStateHandle {
                            subtask: 1,
                            file: "task-1-1".into(),
                        },
                    ],
                    states: vec![StateDescriptor {
                        name: "counts".into(),
                        kind: StateKind::Value,
                        serializer: SerializerId::postcard::<u64>(),
                    }],
                },
                OperatorMetadata {
                    uid: "source".into(),
                    parallelism: 1,
                    subtasks: vec![SubtaskStateHandle {
                        subtask: 0,
                        file: "task-0-0".into(),
                    }],
                    states: vec![StateDescriptor {
                        name: "splits".into(),
                        kind: StateKind::OperatorList,
                        serializer: SerializerId::postcard::<u64>(),
                    }],
                },
            ],
            state_size: 300,
            tasks: vec![TaskCheckpointStats {
                task: "count".into(),
                subtask: 0,
                sync_ms: 1,
                async_ms: 2,
                ..Default::default()
            }],
            shared_files: Vec::new(),
        }
    }

    pub fn state_file(uid: &str, subtask: u32) -> TaskStateFile {
        TaskStateFile {
            operators: vec![OperatorStateData {
                uid: uid.into(),
                keyed: vec![KeyedTableData {
                    name: "counts".into(),
                    kind: StateKind::Value,
                    serializer: SerializerId::postcard::<u64>(),
                    groups: vec![(subtask * 4, vec![1, 2]), (subtask * 4 + 3, vec![3])],
                }],
                operator: vec![
                    OperatorListData::connector("splits", "source split", vec![vec![9, 9], vec![]]),
                    OperatorListData {
                        name: "everyone".into(),
                        kind: StateKind::UnionList,
                        serializer: SerializerId::postcard::<u8>(),
                        entries: vec![vec![1]],
                    },
                ],
                channel: Some(ChannelStateData {
                    channels_total: 2,
                    channels: vec![(0, vec![vec![5]]), (1, vec![vec![6], vec![7, 8]])],
                }),
            }],
            disk: vec![DiskStateData {
                uid: uid.into(),
                instance: format!("instance-{subtask}"),
                first_key_group: subtask * 4,
                last_key_group: subtask * 4 + 3,
                states: vec![StateDescriptor {
                    name: "counts".into(),
                    kind: StateKind::Value,
                    serializer: SerializerId::postcard::<u64>(),
                }],
                files: vec![DiskFile {
                    name: "CURRENT".into(),
                    location: DiskFileLocation::Inline(b"MANIFEST-000005\n".to_vec()),
                }],
            }],
        }
    }

    /// The state files `metadata()` names.
    pub fn state_files() -> Vec<(String, TaskStateFile)> {
        vec![
            ("task-1-0".into(), state_file("count", 0)),
            ("task-1-1".into(), state_file("count", 1)),
            ("task-0-0".into(), state_file("source", 0)),
        ]
    }

    pub fn configs() -> Vec<String> {
        [
            "",
            "parallelism.default: 4\npipeline.max-parallelism: 256\n",
            "execution.checkpointing:\n  interval: 500ms\n  mode: AT_LEAST_ONCE\n  unaligned.enabled: true\n  aligned-checkpoint-timeout: 100 ms\n",
            "restart-strategy:\n  type: exponential-delay\n  exponential-delay.initial-backoff: 1 s\n  exponential-delay.max-backoff: 1 min\nstate.checkpoints.dir: file:///tmp/chk\nstate.checkpoints.num-retained: 3\n",
            "restart-strategy.type: failure-rate\nrestart-strategy.failure-rate.max-failures-per-interval: 2\n\u{0}execution.checkpointing.timeout=10 s\njobmanager.execution.failover-strategy=full\n",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

/// Decodes a frame as `T`; a decoded message re-encodes to a frame that decodes to the same
/// encoding (postcard may accept a non-canonical varint, so the first encoding is compared).
pub fn check_frame<T: serde::Serialize + serde::de::DeserializeOwned>(
    input: &[u8],
) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let msg = read_frame::<_, T>(&mut &input[..], &mut buf).ok()?;
    let mut wire = Vec::new();
    write_frame(&mut wire, &msg).unwrap();
    let again = read_frame::<_, T>(&mut &wire[..], &mut buf).unwrap();
    let mut wire_again = Vec::new();
    write_frame(&mut wire_again, &again).unwrap();
    assert_eq!(wire, wire_again);
    Some(wire)
}

pub fn check_any_frame(input: &[u8]) -> bool {
    let a = check_frame::<DataMsg>(input);
    let b = check_frame::<ToWorker>(input);
    let c = check_frame::<ToCoordinator>(input);
    a.is_some() || b.is_some() || c.is_some()
}

pub fn framed_payload_seeds<T: serde::Serialize>(values: &[T]) -> Vec<Vec<u8>> {
    values
        .iter()
        .map(|v| postcard::to_stdvec(v).unwrap())
        .collect()
}

/// Decodes `input` as a file of `kind` both raw (header checks) and as a payload in a valid
/// frame (so that mutations reach the payload decoder past the checksum).
pub fn check_file<T>(kind: FileKind, input: &[u8]) -> Option<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let _ = decode::<T>(kind, input);
    let value = decode::<T>(kind, &encode_frame(kind, input)).ok()?;
    let again: T = decode(kind, &encode(kind, &value).unwrap()).unwrap();
    assert_eq!(again, value);
    Some(value)
}

/// Restores a checkpoint whose `_metadata` payload is the first `u16`-prefixed part of the
/// input and whose state files all have the rest as payload. A checkpoint that loads must
/// satisfy what the tasks rely on when they restore it.
pub fn check_restore(input: &[u8]) -> bool {
    let Some((len, rest)) = input.split_first_chunk::<2>() else {
        return false;
    };
    let split = (u16::from_le_bytes(*len) as usize).min(rest.len());
    let (meta, state) = rest.split_at(split);
    let storage = MemoryStorage::new();
    storage
        .write(
            "job/chk-3/_metadata",
            &encode_frame(FileKind::Metadata, meta),
        )
        .unwrap();
    for (name, _) in seeds::state_files() {
        storage
            .write(
                &format!("job/chk-3/{name}"),
                &encode_frame(FileKind::TaskState, state),
            )
            .unwrap();
    }
    let Ok(c) = load_checkpoint(&storage, "job", 3) else {
        return false;
    };
    let maxp = c.metadata.max_parallelism;
    let uids: Vec<String> = c.uids().map(str::to_string).collect();
    for uid in uids {
        let p = c.parallelism_of(&uid).unwrap_or(1);
        for parallelism in [p, p + 1] {
            for subtask in 0..parallelism.min(4) {
                let r = c.restored_for(&uid, subtask, parallelism);
                assert!(r
                    .keyed
                    .values()
                    .flat_map(|t| &t.groups)
                    .all(|(kg, _)| *kg < maxp));
                if let Some(ch) = r.channel {
                    assert!(ch.channels.iter().all(|(i, _)| *i < ch.channels_total));
                }
            }
        }
    }
    true
}

/// Restore inputs: a valid checkpoint in `check_restore`'s layout (every state file holds the
/// state of all operators, so any of them serves every handle).
pub fn restore_seeds() -> Vec<Vec<u8>> {
    let meta = postcard::to_stdvec(&seeds::metadata()).unwrap();
    let mut all = seeds::state_file("count", 0);
    all.operators
        .extend(seeds::state_file("source", 0).operators);
    let state = postcard::to_stdvec(&all).unwrap();
    let mut input = (meta.len() as u16).to_le_bytes().to_vec();
    input.extend_from_slice(&meta);
    input.extend_from_slice(&state);
    vec![input]
}

/// YAML, then after a NUL byte one `-D` flag (`key=value`) per line, as `cairn run` applies
/// them. A configuration that parses survives the trip to a worker (YAML of its serde shape).
pub fn check_config(input: &[u8]) -> Option<JobConfig> {
    let text = std::str::from_utf8(input).ok()?;
    let (yaml, defines) = text.split_once('\0').unwrap_or((text, ""));
    let _ = serde_norway::from_str::<JobConfig>(yaml);
    let mut config = JobConfig::from_yaml_str(yaml).ok()?;
    let pairs: Vec<(&str, &str)> = defines
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    config.set_all(pairs).ok()?;
    let _ = config.validate();
    let _ = config.describe();
    let wire = serde_norway::to_string(&config).unwrap();
    let back: JobConfig = serde_norway::from_str(&wire).unwrap();
    assert_eq!(back, config);
    Some(config)
}

pub fn config_seeds() -> Vec<Vec<u8>> {
    seeds::configs()
        .into_iter()
        .map(String::into_bytes)
        .collect()
}
