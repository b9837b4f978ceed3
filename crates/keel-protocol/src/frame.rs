//! Length-prefixed framing: every Kafka request and response is a big-endian
//! `i32` size followed by that many bytes.

use std::fmt;

/// Bytes of the size prefix in front of every frame.
pub const FRAME_PREFIX_BYTES: usize = 4;

/// The smallest request that can be answered: api key (2), api version (2)
/// and correlation id (4). Anything shorter cannot even be replied to.
pub const MIN_REQUEST_BYTES: usize = 8;

/// Why a frame's size prefix was refused. The connection is closed after any
/// of these: the stream can no longer be trusted to be in sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Smaller than [`MIN_REQUEST_BYTES`] (including negative sizes).
    TooSmall { size: i32 },
    /// Larger than `socket.request.max.bytes`.
    TooLarge { size: i32, max_bytes: usize },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooSmall { size } => {
                write!(f, "request frame of {size} bytes is too small")
            }
            FrameError::TooLarge { size, max_bytes } => write!(
                f,
                "request frame of {size} bytes exceeds socket.request.max.bytes={max_bytes}"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

/// Checks a request's size prefix against the configured maximum before the
/// caller allocates a buffer for it, so no allocation is sized by an
/// unchecked number from the wire.
pub fn request_size(prefix: [u8; FRAME_PREFIX_BYTES], max_bytes: usize) -> Result<usize, FrameError> {
    let size = i32::from_be_bytes(prefix);
    let Ok(len) = usize::try_from(size) else {
        return Err(FrameError::TooSmall { size });
    };
    if len < MIN_REQUEST_BYTES {
        return Err(FrameError::TooSmall { size });
    }
    if len > max_bytes {
        return Err(FrameError::TooLarge { size, max_bytes });
    }
    Ok(len)
}

/// Checks a bare SASL token's size prefix (the frames after a v0
/// SaslHandshake): any size from 0 to `max_bytes`.
pub fn token_size(prefix: [u8; FRAME_PREFIX_BYTES], max_bytes: usize) -> Result<usize, FrameError> {
    let size = i32::from_be_bytes(prefix);
    let Ok(len) = usize::try_from(size) else {
        return Err(FrameError::TooSmall { size });
    };
    if len > max_bytes {
        return Err(FrameError::TooLarge { size, max_bytes });
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_before_allocation() {
        let max = 100 * 1024 * 1024;
        assert_eq!(request_size(12i32.to_be_bytes(), max), Ok(12));
        assert_eq!(request_size(8i32.to_be_bytes(), max), Ok(8));
        assert!(matches!(
            request_size(7i32.to_be_bytes(), max),
            Err(FrameError::TooSmall { .. })
        ));
        assert!(matches!(
            request_size((-1i32).to_be_bytes(), max),
            Err(FrameError::TooSmall { .. })
        ));
        assert!(matches!(
            request_size(i32::MAX.to_be_bytes(), max),
            Err(FrameError::TooLarge { .. })
        ));
        assert_eq!(request_size((max as i32).to_be_bytes(), max), Ok(max));
    }
}
