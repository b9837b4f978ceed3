//! Requests crafted to make the decoder allocate by a count read off the
//! wire. Without the guarded allocator these abort the process.

use bytes::{BufMut, Bytes, BytesMut};
use keel_protocol::alloc_guard::GuardedAlloc;
use keel_protocol::{decode, DecodeError, RequestFrame};

#[global_allocator]
static ALLOC: GuardedAlloc = GuardedAlloc;

fn header(buf: &mut BytesMut, key: i16, version: i16) {
    buf.put_i16(key);
    buf.put_i16(version);
    buf.put_i32(1);
    buf.put_i16(-1); // null client id
}

#[test]
fn produce_with_two_billion_topics_is_malformed_not_fatal() {
    let mut buf = BytesMut::new();
    header(&mut buf, 0, 3);
    buf.put_i16(-1); // transactional id
    buf.put_i16(1); // acks
    buf.put_i32(1000); // timeout
    buf.put_i32(i32::MAX); // topic count
    buf.put_slice(&[0; 16]);
    let frame = RequestFrame::parse(buf.freeze()).unwrap();
    assert!(matches!(decode(&frame), Err(DecodeError::Malformed { .. })));
}

#[test]
fn flexible_fetch_with_huge_compact_array_is_malformed_not_fatal() {
    let mut buf = BytesMut::new();
    header(&mut buf, 1, 12);
    buf.put_u8(0); // header tagged fields
    buf.put_i32(-1); // replica id
    buf.put_i32(500); // max wait
    buf.put_i32(1); // min bytes
    buf.put_i32(1 << 20); // max bytes
    buf.put_i8(0); // isolation
    buf.put_i32(0); // session id
    buf.put_i32(-1); // session epoch
    buf.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // compact array length 2^32-1
    let frame = RequestFrame::parse(Bytes::from(buf.to_vec())).unwrap();
    assert!(matches!(decode(&frame), Err(DecodeError::Malformed { .. })));
}
