//! Frames on cairn's TCP connections: `[length u32 LE][version u8][postcard payload]`.
//!
//! Every frame is bounded ([`FRAME_BYTES_MAX`]) and versioned; a frame that is oversized, of
//! another version, or does not decode is an error that closes the connection — never a panic
//! and never an unbounded allocation.

use std::io::{ErrorKind, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Version of the wire protocol.
pub const PROTOCOL_VERSION: u8 = 12;
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

/// How requests and responses of HTTP/1 begin: read as a frame's length prefix, these bytes
/// mean the peer speaks HTTP (someone dialled a REST port) rather than cairn's protocol.
const HTTP_STARTS: [&[u8; 4]; 9] = [
    b"HTTP", b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN",
];

impl FrameError {
    /// Whether the read timed out: the peer sent nothing for the socket's read timeout.
    pub fn timed_out(&self) -> bool {
        matches!(self, FrameError::Io(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
    }

    /// Whether the peer answered in HTTP: the length prefix of the frame was the beginning of
    /// an HTTP/1 request or response.
    pub fn speaks_http(&self) -> bool {
        match self {
            FrameError::TooLarge { len } => {
                u32::try_from(*len).is_ok_and(|len| HTTP_STARTS.contains(&&len.to_le_bytes()))
            }
            _ => false,
        }
    }
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
    // Only an end of stream before a frame's first byte is a clean close; inside the length
    // prefix it is a torn frame, an error like a torn payload.
    loop {
        match r.read(&mut len[..1]) {
            Ok(0) => return Err(FrameError::Closed),
            Ok(_) => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    r.read_exact(&mut len[1..])?;
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
    let (msg, rest) =
        postcard::take_from_bytes(&buf[1..]).map_err(|e| FrameError::Malformed(e.to_string()))?;
    // Bytes left over mean the sender wrote another message than the one expected.
    if !rest.is_empty() {
        return Err(FrameError::Malformed(format!(
            "{} bytes after the message",
            rest.len()
        )));
    }
    Ok(msg)
}

/// Writes one message on a shared connection; false if the connection is over. A failed write
/// closes it: a frame written in part leaves the stream unreadable, and a write that timed out
/// means the peer takes no bytes.
pub(crate) fn send_or_close<T: serde::Serialize>(
    w: &std::sync::Mutex<std::net::TcpStream>,
    msg: &T,
) -> bool {
    let Ok(mut s) = w.lock() else {
        return false;
    };
    match write_frame(&mut *s, msg) {
        Ok(()) => true,
        Err(_) => {
            let _ = s.shutdown(std::net::Shutdown::Both);
            false
        }
    }
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
        let other = PROTOCOL_VERSION.wrapping_add(1);
        let bad_version = [2u8, 0, 0, 0, other, 1];
        assert!(matches!(
            read_frame::<_, u8>(&mut &bad_version[..], &mut buf),
            Err(FrameError::BadVersion(v)) if v == other
        ));
        let truncated = [10u8, 0, 0, 0, 1, 1];
        assert!(matches!(
            read_frame::<_, u8>(&mut &truncated[..], &mut buf),
            Err(FrameError::Truncated { len: 10 })
        ));
    }

    #[test]
    fn http_is_recognised_by_its_first_bytes() {
        let mut buf = Vec::new();
        for text in [
            &b"HTTP/1.1 400 Bad Request\r\n"[..],
            b"GET / HTTP/1.1\r\n",
            b"POST /jobs HTTP/1.1\r\n",
        ] {
            let e = read_frame::<_, u8>(&mut &text[..], &mut buf).unwrap_err();
            assert!(e.speaks_http(), "{text:?}: {e}");
        }
        for junk in [&b"hello world"[..], &[0xff; 8], b"HTTX"] {
            let e = read_frame::<_, u8>(&mut &junk[..], &mut buf).unwrap_err();
            assert!(!e.speaks_http(), "{junk:?}: {e}");
        }
    }

    #[test]
    fn a_torn_length_prefix_is_not_a_clean_close() {
        let mut buf = Vec::new();
        for n in 1..4 {
            let torn = [1u8, 0, 0][..n].to_vec();
            assert!(
                matches!(
                    read_frame::<_, u8>(&mut &torn[..], &mut buf),
                    Err(FrameError::Io(ref e)) if e.kind() == ErrorKind::UnexpectedEof
                ),
                "{n} bytes of a length prefix"
            );
        }
    }

    #[test]
    fn bytes_after_the_message_are_malformed() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &(7u32, 8u32)).unwrap();
        let mut buf = Vec::new();
        // Read as a shorter message, the frame has a byte left over.
        assert!(matches!(
            read_frame::<_, u32>(&mut &wire[..], &mut buf),
            Err(FrameError::Malformed(m)) if m == "1 bytes after the message"
        ));
    }

    /// What reading one frame of `(String, Vec<u64>)` from `bytes` must give, derived from the
    /// wire format independently of `read_frame`'s code.
    fn expected(bytes: &[u8]) -> Result<Vec<u8>, &'static str> {
        if bytes.is_empty() {
            return Err("closed");
        }
        if bytes.len() < 4 {
            return Err("eof");
        }
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if len > FRAME_BYTES_MAX {
            return Err("too large");
        }
        if len == 0 {
            return Err("malformed");
        }
        if bytes.len() < 4 + len {
            return Err("truncated");
        }
        if bytes[4] != PROTOCOL_VERSION {
            return Err("version");
        }
        match postcard::take_from_bytes::<(String, Vec<u64>)>(&bytes[5..4 + len]) {
            Ok((_, [])) => Ok(bytes[..4 + len].to_vec()),
            _ => Err("malformed"),
        }
    }

    #[test]
    fn junk_gives_the_error_of_the_stage_it_fails() {
        let mut rng = 12345u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut buf = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..4000 {
            let n = (next() % 40) as usize;
            let mut junk: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            // Three in four inputs start like a real frame, so that later stages are reached:
            // a plausible length with any version, with the right version, or a real frame
            // with one byte changed or cut short.
            match i % 4 {
                1 | 2 if n >= 5 => {
                    let len = (next() % (n as u64 + 2)) as u32;
                    junk[..4].copy_from_slice(&len.to_le_bytes());
                    if i % 4 == 2 {
                        junk[4] = PROTOCOL_VERSION;
                    }
                }
                3 => {
                    let text: String = (0..next() % 5).map(|_| 'x').collect();
                    let numbers: Vec<u64> = (0..next() % 4).map(|_| next() % 1000).collect();
                    junk.clear();
                    write_frame(&mut junk, &(text, numbers)).unwrap();
                    match next() % 3 {
                        0 => {
                            let at = (next() as usize) % junk.len();
                            junk[at] = next() as u8;
                        }
                        1 => junk.truncate((next() as usize) % junk.len()),
                        _ => {}
                    }
                }
                _ => {}
            }
            let got = read_frame::<_, (String, Vec<u64>)>(&mut &junk[..], &mut buf);
            let want = expected(&junk);
            match (&got, &want) {
                (Ok(msg), Ok(frame)) => {
                    let mut again = Vec::new();
                    write_frame(&mut again, msg).unwrap();
                    assert_eq!(&again, frame, "{junk:?} decoded as {msg:?}");
                }
                (Err(FrameError::Closed), Err("closed"))
                | (Err(FrameError::TooLarge { .. }), Err("too large"))
                | (Err(FrameError::BadVersion(_)), Err("version"))
                | (Err(FrameError::Malformed(_)), Err("malformed")) => {}
                (Err(FrameError::Io(e)), Err("eof")) if e.kind() == ErrorKind::UnexpectedEof => {}
                (Err(FrameError::Truncated { .. }), Err("truncated")) => {}
                _ => panic!("{junk:?}: got {got:?}, expected {want:?}"),
            }
            seen.insert(want.map_or_else(|stage| stage, |_| "ok"));
        }
        let every = [
            "closed",
            "eof",
            "malformed",
            "ok",
            "too large",
            "truncated",
            "version",
        ];
        assert_eq!(seen, every.into_iter().collect(), "stages reached");
    }
}
