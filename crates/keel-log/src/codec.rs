//! Kafka's record-batch codecs: the records section of a batch whose
//! attributes name gzip (1), snappy (2), lz4 (3) or zstd (4), in the framing
//! Kafka's clients write and read.
//!
//! * gzip: RFC 1952 members (read as a multi-member stream, as Java's
//!   `GZIPInputStream` does); written at level 6.
//! * snappy: written in the xerial framing Java's `SnappyOutputStream`
//!   writes (`0x82 "SNAPPY" 0`, version 1, compatible version 1, then
//!   big-endian-length-prefixed raw blocks of up to 32 KiB); read in that
//!   framing or as one raw snappy block (what librdkafka writes).
//! * lz4: the LZ4 frame format; written as Kafka's `Lz4BlockOutputStream`
//!   does (independent 64 KiB blocks, no block or content checksum).
//! * zstd: one zstd frame; written at level 3, Kafka's default.
//!
//! The log stores batches as producers sent them, unless the topic's
//! `compression.type` names another codec: then the produce path writes
//! the batch in that codec, as Kafka does. The codecs also run where Keel
//! has to look inside a batch: the cleaner (which writes a batch it
//! shortens with the batch's own codec, as Kafka's does) and the produce
//! checks of compacted topics. Decompression stops at a stated size, so a small batch
//! that inflates without end costs an error, not the broker's memory.

// Parsing code: bad bytes are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::io::{self, Read, Write};

/// The most bytes a batch's records may decompress to. Kafka streams the
/// records out of a compressed batch without a bound; Keel states one, far
/// above what a producer's `batch.size` makes (16 KiB by default).
pub const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;

const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;
const XERIAL_BLOCK: usize = 32 << 10;
const GZIP_LEVEL: u32 = 6;
const ZSTD_LEVEL: i32 = 3;

/// A batch's compression codec (attributes bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl Codec {
    /// The codec a batch's attribute bits name; `None` for an id Kafka
    /// does not define (5-7).
    pub fn from_id(id: u8) -> Option<Codec> {
        Some(match id {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            _ => return None,
        })
    }

    /// Kafka's name for the codec (`compression.type`).
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Gzip => "gzip",
            Codec::Snappy => "snappy",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// The bytes `data` decompresses to, at most `limit` of them.
    pub fn decompress(self, data: &[u8], limit: usize) -> io::Result<Vec<u8>> {
        match self {
            Codec::None => {
                if data.len() > limit {
                    return Err(too_large(limit));
                }
                Ok(data.to_vec())
            }
            Codec::Gzip => read_limited(flate2::read::MultiGzDecoder::new(data), limit),
            Codec::Snappy => snappy_decompress(data, limit),
            Codec::Lz4 => read_limited(lz4_flex::frame::FrameDecoder::new(data), limit),
            Codec::Zstd => read_limited(zstd::stream::read::Decoder::with_buffer(data)?, limit),
        }
    }

    /// `data` compressed as a Kafka client of this codec writes it.
    pub fn compress(self, data: &[u8]) -> io::Result<Vec<u8>> {
        self.compress_at(data, None)
    }

    /// Kafka's name for a `compression.type` value: `uncompressed` or a
    /// codec (`producer`, which keeps the producer's codec, is not one).
    pub fn from_config_name(name: &str) -> Option<Codec> {
        Some(match name {
            "uncompressed" => Codec::None,
            "gzip" => Codec::Gzip,
            "snappy" => Codec::Snappy,
            "lz4" => Codec::Lz4,
            "zstd" => Codec::Zstd,
            _ => return None,
        })
    }

    /// Kafka's range for this codec's `compression.<codec>.level` (KIP-390),
    /// if it has levels: gzip 1..=9, lz4 1..=17, zstd -131072..=22.
    pub fn level_range(self) -> Option<std::ops::RangeInclusive<i32>> {
        match self {
            Codec::Gzip => Some(1..=9),
            Codec::Lz4 => Some(1..=17),
            Codec::Zstd => Some(-131_072..=22),
            Codec::None | Codec::Snappy => None,
        }
    }

    /// `data` compressed with this codec at `level` (`None`: the codec's
    /// default, gzip 6 and zstd 3 as in Kafka). gzip and zstd honour the
    /// level; the lz4 encoder has one level (LZ4's fast compressor), so an
    /// lz4 level changes nothing; snappy has none.
    pub fn compress_at(self, data: &[u8], level: Option<i32>) -> io::Result<Vec<u8>> {
        match self {
            Codec::None => Ok(data.to_vec()),
            Codec::Gzip => {
                let level = level
                    .and_then(|l| u32::try_from(l).ok())
                    .map_or(GZIP_LEVEL, |l| l.min(9));
                let mut out = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
                out.write_all(data)?;
                out.finish()
            }
            Codec::Snappy => snappy_compress(data),
            Codec::Lz4 => {
                let info = lz4_flex::frame::FrameInfo::new()
                    .block_size(lz4_flex::frame::BlockSize::Max64KB)
                    .block_mode(lz4_flex::frame::BlockMode::Independent)
                    .content_checksum(false)
                    .block_checksums(false);
                let mut out = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
                out.write_all(data)?;
                out.finish().map_err(io::Error::other)
            }
            Codec::Zstd => zstd::bulk::compress(data, level.unwrap_or(ZSTD_LEVEL)),
        }
    }
}

/// The error [`Codec::decompress`] returns past its limit, told apart from
/// corrupt data by [`is_too_large`].
#[derive(Debug)]
struct TooLarge {
    limit: usize,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "records decompress to more than {} bytes", self.limit)
    }
}

impl std::error::Error for TooLarge {}

fn too_large(limit: usize) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, TooLarge { limit })
}

/// Whether a [`Codec::decompress`] error is its limit rather than bad data.
pub fn is_too_large(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<TooLarge>())
}

fn corrupt(codec: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{codec} data: {e}"))
}

/// Reads `reader` to its end, refusing more than `limit` bytes.
fn read_limited(reader: impl Read, limit: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| corrupt("compressed", e))?;
    if out.len() > limit {
        return Err(too_large(limit));
    }
    Ok(out)
}

fn snappy_decompress(data: &[u8], limit: usize) -> io::Result<Vec<u8>> {
    let mut decoder = snap::raw::Decoder::new();
    let mut block = |raw: &[u8], out: &mut Vec<u8>| -> io::Result<()> {
        let len = snap::raw::decompress_len(raw).map_err(|e| corrupt("snappy", e))?;
        if out.len().saturating_add(len) > limit {
            return Err(too_large(limit));
        }
        let at = out.len();
        out.resize(at + len, 0);
        let n = decoder
            .decompress(raw, &mut out[at..])
            .map_err(|e| corrupt("snappy", e))?;
        out.truncate(at + n);
        Ok(())
    };
    let mut out = Vec::new();
    if data.len() < XERIAL_HEADER_LEN || data[..XERIAL_MAGIC.len()] != XERIAL_MAGIC {
        block(data, &mut out)?;
        return Ok(out);
    }
    let mut rest = &data[XERIAL_HEADER_LEN..];
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| corrupt("snappy", "xerial block length truncated"))?;
        let len = usize::try_from(u32::from_be_bytes(*len)).map_err(|e| corrupt("snappy", e))?;
        let raw = tail
            .get(..len)
            .ok_or_else(|| corrupt("snappy", "xerial block runs past the data"))?;
        block(raw, &mut out)?;
        rest = &tail[len..];
    }
    Ok(out)
}

fn snappy_compress(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut encoder = snap::raw::Encoder::new();
    let mut out = Vec::with_capacity(XERIAL_HEADER_LEN + snap::raw::max_compress_len(data.len()));
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&1i32.to_be_bytes());
    out.extend_from_slice(&1i32.to_be_bytes());
    for chunk in data.chunks(XERIAL_BLOCK) {
        let block = encoder.compress_vec(chunk).map_err(io::Error::other)?;
        let len = u32::try_from(block.len()).map_err(io::Error::other)?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&block);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Codec; 5] = [Codec::None, Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ (i / 7) as u8).collect()
    }

    #[test]
    fn every_codec_reads_back_what_it_writes() {
        for codec in ALL {
            for len in [0, 1, 100, XERIAL_BLOCK, 3 * XERIAL_BLOCK + 17, 300_000] {
                let data = sample(len);
                let packed = codec.compress(&data).unwrap();
                let back = codec.decompress(&packed, len).unwrap();
                assert_eq!(back, data, "{} at {len}", codec.name());
            }
        }
    }

    #[test]
    fn decompression_stops_at_the_limit() {
        let zeros = vec![0u8; 1 << 20];
        for codec in ALL {
            let packed = codec.compress(&zeros).unwrap();
            let e = codec.decompress(&packed, (1 << 20) - 1).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{}", codec.name());
            assert!(e.to_string().contains("more than"), "{}: {e}", codec.name());
            assert!(is_too_large(&e), "{}", codec.name());
        }
    }

    #[test]
    fn snappy_reads_a_raw_block_and_the_xerial_framing() {
        let data = sample(100_000);
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(Codec::Snappy.decompress(&raw, data.len()).unwrap(), data);
        let framed = Codec::Snappy.compress(&data).unwrap();
        assert_eq!(framed[..8], XERIAL_MAGIC);
        assert_eq!(framed[8..16], [0, 0, 0, 1, 0, 0, 0, 1]);
    }

    #[test]
    fn lz4_writes_kafkas_frame_descriptor() {
        let packed = Codec::Lz4.compress(b"keel").unwrap();
        assert_eq!(packed[..4], [0x04, 0x22, 0x4d, 0x18], "frame magic");
        // FLG: version 01, independent blocks, no checksums, no size.
        assert_eq!(packed[4], 0b0110_0000);
        // BD: 64 KiB blocks.
        assert_eq!(packed[5], 0b0100_0000);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..200 {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as u8
                })
                .collect();
            for codec in ALL {
                let _ = codec.decompress(&data, 1 << 16);
            }
            let mut framed = XERIAL_MAGIC.to_vec();
            framed.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
            framed.extend_from_slice(&data);
            let _ = Codec::Snappy.decompress(&framed, 1 << 16);
        }
    }
}
