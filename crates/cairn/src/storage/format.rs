//! Framing of checkpoint files.
//!
//! Every file cairn writes into checkpoint storage is wrapped in a small
//! frame carrying a format version and a checksum, so that a torn, truncated
//! or otherwise corrupt file is rejected instead of being read as state.
//!
//! # Frame layout
//!
//! All integers are little-endian. The header is [`HEADER_LEN`] (21) bytes.
//!
//! | offset | size | field                                        |
//! |-------:|-----:|----------------------------------------------|
//! |      0 |    6 | magic, `b"CAIRN\x00"` ([`MAGIC`])            |
//! |      6 |    1 | file kind ([`FileKind`] as `u8`)             |
//! |      7 |    2 | format version (`u16`, [`FORMAT_VERSION`])   |
//! |      9 |    8 | payload length in bytes (`u64`)              |
//! |     17 |    4 | CRC32 of version and payload (`u32`)         |
//! |     21 |    n | payload                                      |
//!
//! From version 3 the CRC32 (`crc32fast`) covers the version's two bytes and then the
//! payload; in version 2 it covered the payload only.
//!
//! The file must end exactly after the payload: trailing bytes are rejected
//! with [`FormatError::LengthMismatch`]. [`encode`] and [`decode`] use
//! `postcard` for the payload of serializable values.
//!
//! Decoding validates, in order: the magic bytes, the header length, the
//! version, the kind, the payload length and finally the checksum. It never
//! panics, whatever the input.

use std::fmt;

use thiserror::Error;

/// The current version of the checkpoint file format. Version 2: keys are placed in key
/// groups by their stable key encoding, and every state carries its kind and serializer;
/// version 1 files are refused, since their key groups differ. Version 3 appends one list to
/// the end of `_metadata` (the shared files a checkpoint references) and of a task state file
/// (the handles of embedded disk state): a version 2 file of those kinds reads as version 3
/// with that list empty ([`OLDEST_READABLE_VERSION`]).
pub const FORMAT_VERSION: u16 = 3;

/// The oldest version this build reads.
pub const OLDEST_READABLE_VERSION: u16 = 2;

/// Magic bytes at the start of every checkpoint file.
pub const MAGIC: [u8; 6] = *b"CAIRN\x00";

/// Length in bytes of the frame header that precedes the payload.
pub const HEADER_LEN: usize = MAGIC.len() + 1 + 2 + 8 + 4;

const KIND_OFFSET: usize = 6;
const VERSION_OFFSET: usize = 7;
const LENGTH_OFFSET: usize = 9;
const CRC_OFFSET: usize = 17;

/// What a checkpoint file contains; stored in the frame header so that one
/// kind of file is never mistaken for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileKind {
    /// The `_metadata` file that completes a checkpoint.
    Metadata = 1,
    /// Operator state of one task.
    TaskState = 2,
    /// In-flight channel data (unaligned checkpoints).
    ChannelState = 3,
    /// State shared between checkpoints (incremental checkpoints).
    SharedState = 4,
}

impl FileKind {
    /// All file kinds.
    pub const ALL: [FileKind; 4] = [
        FileKind::Metadata,
        FileKind::TaskState,
        FileKind::ChannelState,
        FileKind::SharedState,
    ];

    /// The byte stored in the frame header for this kind.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The kind stored as `byte` in a frame header, if it is a known kind.
    pub const fn from_u8(byte: u8) -> Option<FileKind> {
        match byte {
            1 => Some(FileKind::Metadata),
            2 => Some(FileKind::TaskState),
            3 => Some(FileKind::ChannelState),
            4 => Some(FileKind::SharedState),
            _ => None,
        }
    }

    /// A human-readable name, e.g. `"task state"`.
    pub const fn name(self) -> &'static str {
        match self {
            FileKind::Metadata => "metadata",
            FileKind::TaskState => "task state",
            FileKind::ChannelState => "channel state",
            FileKind::SharedState => "shared state",
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a checkpoint file could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    /// The file ends before the header or the declared payload does.
    #[error("file is truncated: expected {expected} bytes, found only {actual}")]
    Truncated {
        /// Number of bytes the file should have at least.
        expected: u64,
        /// Number of bytes it has.
        actual: u64,
    },
    /// The file does not start with the cairn magic bytes.
    #[error("not a cairn checkpoint file (bad magic bytes)")]
    BadMagic,
    /// The file was written in a format version this build cannot read.
    #[error(
        "unsupported checkpoint format version {0} (this build reads version {supported})",
        supported = FORMAT_VERSION
    )]
    UnsupportedVersion(u16),
    /// The file is a different kind of checkpoint file than expected.
    #[error("wrong file kind: expected a {expected} file, found {}", describe_kind(*.found))]
    WrongKind {
        /// The kind the reader asked for.
        expected: FileKind,
        /// The kind byte found in the header (possibly not a known kind).
        found: u8,
    },
    /// More bytes follow the header than its payload length declares.
    #[error(
        "payload length mismatch: header declares {declared} bytes but {actual} bytes follow the header"
    )]
    LengthMismatch {
        /// Payload length declared in the header.
        declared: u64,
        /// Number of bytes actually following the header.
        actual: u64,
    },
    /// The payload does not match its stored checksum: the file is corrupt.
    #[error(
        "checksum mismatch: stored {stored:#010x}, computed {computed:#010x} (file is corrupt)"
    )]
    ChecksumMismatch {
        /// CRC32 stored in the header.
        stored: u32,
        /// CRC32 of the payload as read.
        computed: u32,
    },
    /// A value could not be serialized.
    #[error("cannot encode checkpoint data: {0}")]
    Encode(String),
    /// A (checksum-valid) payload could not be deserialized.
    #[error("cannot decode checkpoint data: {0}")]
    Decode(String),
}

fn describe_kind(byte: u8) -> String {
    match FileKind::from_u8(byte) {
        Some(kind) => format!("a {kind} file"),
        None => format!("unknown kind {byte}"),
    }
}

/// Wraps `payload` in a frame of the given kind (see the module docs).
pub fn encode_frame(kind: FileKind, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(kind.as_u8());
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(FORMAT_VERSION, payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Validates a frame of the given kind and returns its payload.
pub fn decode_frame(kind: FileKind, bytes: &[u8]) -> Result<&[u8], FormatError> {
    decode_versioned_frame(kind, bytes).map(|(_, payload)| payload)
}

/// Validates a frame of the given kind and returns its format version and payload.
pub fn decode_versioned_frame(kind: FileKind, bytes: &[u8]) -> Result<(u16, &[u8]), FormatError> {
    // Check whatever part of the magic is present first, so that a short
    // foreign file is reported as such rather than as truncated.
    let magic_len = bytes.len().min(MAGIC.len());
    if bytes[..magic_len] != MAGIC[..magic_len] {
        return Err(FormatError::BadMagic);
    }
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(FormatError::Truncated {
            expected: HEADER_LEN as u64,
            actual: bytes.len() as u64,
        });
    };
    let version = u16::from_le_bytes([header[VERSION_OFFSET], header[VERSION_OFFSET + 1]]);
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(FormatError::UnsupportedVersion(version));
    }
    let found = header[KIND_OFFSET];
    if found != kind.as_u8() {
        return Err(FormatError::WrongKind {
            expected: kind,
            found,
        });
    }
    let declared = u64::from_le_bytes(array(&header[LENGTH_OFFSET..CRC_OFFSET]));
    let stored = u32::from_le_bytes(array(&header[CRC_OFFSET..HEADER_LEN]));
    let payload = &bytes[HEADER_LEN..];
    let actual = payload.len() as u64;
    if declared > actual {
        return Err(FormatError::Truncated {
            expected: (HEADER_LEN as u64).saturating_add(declared),
            actual: bytes.len() as u64,
        });
    }
    if declared < actual {
        return Err(FormatError::LengthMismatch { declared, actual });
    }
    let computed = checksum(version, payload);
    if computed != stored {
        return Err(FormatError::ChecksumMismatch { stored, computed });
    }
    Ok((version, payload))
}

/// The checksum of a frame of `version`: from version 3 on it covers the version too, so that
/// a flipped version bit is caught; version 2 covered the payload only.
fn checksum(version: u16, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    if version >= 3 {
        h.update(&version.to_le_bytes());
    }
    h.update(payload);
    h.finalize()
}

/// Copies a slice of known length into an array (callers pass exact ranges).
fn array<const N: usize>(slice: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&slice[..N]);
    out
}

/// Serializes `value` with postcard and frames it as a file of `kind`.
pub fn encode<T: serde::Serialize>(kind: FileKind, value: &T) -> Result<Vec<u8>, FormatError> {
    let payload = postcard::to_stdvec(value).map_err(|e| FormatError::Encode(e.to_string()))?;
    Ok(encode_frame(kind, &payload))
}

/// Validates a frame of `kind` and deserializes its postcard payload.
///
/// The payload must be consumed entirely; leftover bytes are a decode error.
pub fn decode<T: serde::de::DeserializeOwned>(
    kind: FileKind,
    bytes: &[u8],
) -> Result<T, FormatError> {
    let (version, payload) = decode_versioned_frame(kind, bytes)?;
    let upgraded;
    let payload = if version == 2 && matches!(kind, FileKind::Metadata | FileKind::TaskState) {
        // Version 3 appended a list to these files: a version 2 file has it empty.
        upgraded = [payload, &[0u8]].concat();
        &upgraded[..]
    } else {
        payload
    };
    let (value, rest) =
        postcard::take_from_bytes(payload).map_err(|e| FormatError::Decode(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FormatError::Decode(format!(
            "{} unexpected trailing bytes after the value",
            rest.len()
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Sample {
        id: u64,
        name: String,
        offsets: Vec<(u32, i64)>,
        flag: Option<bool>,
    }

    fn sample() -> Sample {
        Sample {
            id: 42,
            name: "source-0".to_string(),
            offsets: vec![(0, 17), (1, -3), (2, i64::MAX)],
            flag: Some(true),
        }
    }

    #[test]
    fn header_len_matches_layout() {
        assert_eq!(HEADER_LEN, 21);
        let frame = encode_frame(FileKind::TaskState, b"abc");
        assert_eq!(frame.len(), HEADER_LEN + 3);
        assert_eq!(&frame[..6], b"CAIRN\x00");
        assert_eq!(frame[6], 2);
        assert_eq!(&frame[7..9], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(&frame[9..17], &3u64.to_le_bytes());
        // Version 3 on: the checksum covers the version and the payload.
        let mut crc = crc32fast::Hasher::new();
        crc.update(&3u16.to_le_bytes());
        crc.update(b"abc");
        assert_eq!(&frame[17..21], &crc.finalize().to_le_bytes());
        assert_eq!(&frame[21..], b"abc");
    }

    #[test]
    fn frame_round_trip() {
        for kind in FileKind::ALL {
            for payload in [&b""[..], b"x", b"hello world", &[0u8; 1000][..]] {
                let frame = encode_frame(kind, payload);
                assert_eq!(decode_frame(kind, &frame).unwrap(), payload);
            }
        }
    }

    #[test]
    fn value_round_trip() {
        let bytes = encode(FileKind::Metadata, &sample()).unwrap();
        let back: Sample = decode(FileKind::Metadata, &bytes).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn kind_byte_round_trip() {
        for kind in FileKind::ALL {
            assert_eq!(FileKind::from_u8(kind.as_u8()), Some(kind));
        }
        assert_eq!(FileKind::from_u8(0), None);
        assert_eq!(FileKind::from_u8(5), None);
    }

    #[test]
    fn wrong_kind_is_rejected() {
        let bytes = encode(FileKind::TaskState, &sample()).unwrap();
        let err = decode::<Sample>(FileKind::Metadata, &bytes).unwrap_err();
        assert_eq!(
            err,
            FormatError::WrongKind {
                expected: FileKind::Metadata,
                found: 2
            }
        );
        assert_eq!(
            err.to_string(),
            "wrong file kind: expected a metadata file, found a task state file"
        );

        let mut bytes = bytes;
        bytes[KIND_OFFSET] = 99;
        let err = decode_frame(FileKind::TaskState, &bytes).unwrap_err();
        assert!(err.to_string().contains("unknown kind 99"), "{err}");
    }

    #[test]
    fn unsupported_version_is_rejected() {
        let mut bytes = encode_frame(FileKind::Metadata, b"payload");
        // Version 1 (cairn before stable key encodings and state descriptors) and a future one.
        for v in [1u16, FORMAT_VERSION + 1] {
            bytes[VERSION_OFFSET..VERSION_OFFSET + 2].copy_from_slice(&v.to_le_bytes());
            let err = decode_frame(FileKind::Metadata, &bytes).unwrap_err();
            assert_eq!(err, FormatError::UnsupportedVersion(v));
            assert!(err.to_string().contains(&format!("version {v}")), "{err}");
        }
    }

    #[test]
    fn bad_magic_is_rejected() {
        assert_eq!(
            decode_frame(FileKind::Metadata, b"{\"json\": true}").unwrap_err(),
            FormatError::BadMagic
        );
        assert_eq!(
            decode_frame(FileKind::Metadata, b"abc").unwrap_err(),
            FormatError::BadMagic
        );
    }

    #[test]
    fn empty_input_is_truncated() {
        let err = decode_frame(FileKind::Metadata, b"").unwrap_err();
        assert_eq!(
            err,
            FormatError::Truncated {
                expected: HEADER_LEN as u64,
                actual: 0
            }
        );
        assert!(err.to_string().starts_with("file is truncated: "), "{err}");
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode_frame(FileKind::SharedState, b"abc");
        bytes.push(0);
        assert_eq!(
            decode_frame(FileKind::SharedState, &bytes).unwrap_err(),
            FormatError::LengthMismatch {
                declared: 3,
                actual: 4
            }
        );
    }

    #[test]
    fn huge_declared_length_does_not_overflow() {
        let mut bytes = encode_frame(FileKind::TaskState, b"abc");
        bytes[LENGTH_OFFSET..CRC_OFFSET].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            decode_frame(FileKind::TaskState, &bytes).unwrap_err(),
            FormatError::Truncated {
                expected: u64::MAX,
                actual: bytes.len() as u64
            }
        );
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = encode(FileKind::TaskState, &sample()).unwrap();
        for len in 0..bytes.len() {
            let err = decode_frame(FileKind::TaskState, &bytes[..len]).unwrap_err();
            assert!(
                matches!(err, FormatError::Truncated { .. }),
                "truncation to {len} bytes gave {err:?}"
            );
        }
    }

    #[test]
    fn every_bit_flip_is_rejected() {
        let bytes = encode(FileKind::ChannelState, &sample()).unwrap();
        for byte in 0..bytes.len() {
            for bit in 0..8 {
                let mut corrupt = bytes.clone();
                corrupt[byte] ^= 1 << bit;
                let result = decode_frame(FileKind::ChannelState, &corrupt);
                let Err(err) = result else {
                    panic!("bit {bit} of byte {byte} flipped was accepted");
                };
                if byte >= HEADER_LEN {
                    assert!(
                        matches!(err, FormatError::ChecksumMismatch { .. }),
                        "payload flip at byte {byte} gave {err:?}"
                    );
                }
                if (CRC_OFFSET..HEADER_LEN).contains(&byte) {
                    assert!(matches!(err, FormatError::ChecksumMismatch { .. }));
                }
                assert!(decode::<Sample>(FileKind::ChannelState, &corrupt).is_err());
            }
        }
    }

    #[test]
    fn arbitrary_bytes_are_rejected_at_every_stage() {
        // Deterministic xorshift so the test is reproducible.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let valid = encode(FileKind::Metadata, &sample()).unwrap();
        let mut rejected_by: std::collections::BTreeMap<&str, usize> = Default::default();
        let mut check = |bytes: &[u8]| match decode::<Sample>(FileKind::Metadata, bytes) {
            // Only the valid file itself decodes, and to what was encoded.
            Ok(v) => {
                assert_eq!(bytes, valid.as_slice(), "garbage accepted as {v:?}");
                assert_eq!(v, sample());
            }
            Err(e) => {
                assert!(!e.to_string().contains('\n'), "{e}");
                let stage = match e {
                    FormatError::Truncated { .. } => "truncated",
                    FormatError::BadMagic => "magic",
                    FormatError::UnsupportedVersion(_) => "version",
                    FormatError::WrongKind { .. } => "kind",
                    FormatError::LengthMismatch { .. } => "length",
                    FormatError::ChecksumMismatch { .. } => "checksum",
                    FormatError::Decode(_) => "decode",
                    FormatError::Encode(_) => panic!("decoding gave an encode error: {e}"),
                };
                *rejected_by.entry(stage).or_default() += 1;
            }
        };
        for _ in 0..2000 {
            let len = (next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            check(&bytes);
            // Keep a valid header prefix so that deeper checks are reached.
            let keep = (next() as usize) % (valid.len() + 1);
            bytes.splice(0..0, valid[..keep].iter().copied());
            check(&bytes);
        }
        // The inputs reach every check up to the checksum, or the loop tests little.
        for stage in ["truncated", "magic", "length", "checksum"] {
            assert!(rejected_by.contains_key(stage), "{stage}: {rejected_by:?}");
        }
    }

    #[test]
    fn payload_garbage_with_valid_checksum_is_a_decode_error() {
        let frame = encode_frame(FileKind::TaskState, &[0xFF; 3]);
        let err = decode::<Sample>(FileKind::TaskState, &frame).unwrap_err();
        assert!(matches!(err, FormatError::Decode(_)), "{err:?}");

        // Valid value followed by extra bytes inside the payload.
        let mut payload = postcard::to_stdvec(&sample()).unwrap();
        payload.push(0);
        let frame = encode_frame(FileKind::TaskState, &payload);
        let err = decode::<Sample>(FileKind::TaskState, &frame).unwrap_err();
        assert!(matches!(err, FormatError::Decode(_)), "{err:?}");
    }
}
