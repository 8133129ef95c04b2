//! Frames on cairn's TCP connections: `[length u32 LE][version u8][postcard payload]`.
//!
//! Every frame is bounded ([`FRAME_BYTES_MAX`]) and versioned; a frame that is oversized, of
//! another version, or does not decode is an error that closes the connection — never a panic
//! and never an unbounded allocation.

use std::io::{ErrorKind, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Version of the wire protocol.
pub const PROTOCOL_VERSION: u8 = 1;
/// Largest frame accepted (payload plus version byte).
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// The first read of a frame's body asks for at most this much; later reads double it.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    /// Socket error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The length prefix exceeds the limit.
    #[error("frame of {len} bytes exceeds the limit of {FRAME_BYTES_MAX} bytes")]
    TooLarge {
        /// Announced length.
        len: usize,
    },
    /// The connection ended inside a frame.
    #[error("connection closed inside a frame of {len} bytes")]
    Truncated {
        /// Announced length.
        len: usize,
    },
    /// Another protocol version.
    #[error("frame of protocol version {0}, expected {PROTOCOL_VERSION}")]
    BadVersion(u8),
    /// The payload does not decode.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Writes one frame (one `write_all` of the whole frame).
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), FrameError> {
    let mut buf = vec![0u8; 5];
    buf = postcard::to_extend(msg, buf).map_err(|e| FrameError::Malformed(e.to_string()))?;
    let len = buf.len() - 4;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge { len });
    }
    buf[..4].copy_from_slice(&(len as u32).to_le_bytes());
    buf[4] = PROTOCOL_VERSION;
    w.write_all(&buf)?;
    Ok(())
}

/// Reads one frame; `buf` is reused between calls.
pub fn read_frame<R: Read, T: DeserializeOwned>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    if let Err(e) = r.read_exact(&mut len) {
        return Err(if e.kind() == ErrorKind::UnexpectedEof {
            FrameError::Closed
        } else {
            FrameError::Io(e)
        });
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge { len });
    }
    if len == 0 {
        return Err(FrameError::Malformed("empty frame".into()));
    }
    buf.clear();
    // The buffer grows with the bytes that arrive (doubling from one chunk), not to the
    // announced length up front: announcing a large frame and sending nothing costs no memory.
    while buf.len() < len {
        let start = buf.len();
        let end = len.min(start + start.max(READ_CHUNK_BYTES));
        buf.resize(end, 0);
        if let Err(e) = r.read_exact(&mut buf[start..]) {
            return Err(if e.kind() == ErrorKind::UnexpectedEof {
                FrameError::Truncated { len }
            } else {
                FrameError::Io(e)
            });
        }
    }
    if buf[0] != PROTOCOL_VERSION {
        return Err(FrameError::BadVersion(buf[0]));
    }
    postcard::from_bytes(&buf[1..]).map_err(|e| FrameError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_an_error() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &(7u32, String::from("hello"))).unwrap();
        write_frame(&mut wire, &vec![1u8; 1000]).unwrap();
        let mut r = &wire[..];
        let mut buf = Vec::new();
        assert_eq!(
            read_frame::<_, (u32, String)>(&mut r, &mut buf).unwrap(),
            (7, "hello".into())
        );
        assert_eq!(
            read_frame::<_, Vec<u8>>(&mut r, &mut buf).unwrap().len(),
            1000
        );
        assert!(matches!(
            read_frame::<_, u32>(&mut r, &mut buf),
            Err(FrameError::Closed)
        ));

        let huge = (u32::MAX).to_le_bytes();
        assert!(matches!(
            read_frame::<_, u32>(&mut &huge[..], &mut buf),
            Err(FrameError::TooLarge { .. })
        ));
        let bad_version = [2u8, 0, 0, 0, 9, 1];
        assert!(matches!(
            read_frame::<_, u8>(&mut &bad_version[..], &mut buf),
            Err(FrameError::BadVersion(9))
        ));
        let truncated = [10u8, 0, 0, 0, 1, 1];
        assert!(matches!(
            read_frame::<_, u8>(&mut &truncated[..], &mut buf),
            Err(FrameError::Truncated { len: 10 })
        ));
    }
}
