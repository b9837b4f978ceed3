//! Request decoding on arbitrary bytes: frame size check, fixed header,
//! full decode. Nothing here may panic or abort.
#![no_main]

use bytes::Bytes;
use keel_protocol::alloc_guard::GuardedAlloc;
use keel_protocol::frame::{request_size, FRAME_PREFIX_BYTES};
use keel_protocol::{decode, RequestFrame};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: GuardedAlloc = GuardedAlloc;

fuzz_target!(|data: &[u8]| {
    if data.len() >= FRAME_PREFIX_BYTES {
        let mut prefix = [0u8; FRAME_PREFIX_BYTES];
        prefix.copy_from_slice(&data[..FRAME_PREFIX_BYTES]);
        let _ = request_size(prefix, 100 << 20);
    }
    if let Ok(frame) = RequestFrame::parse(Bytes::copy_from_slice(data)) {
        let _ = decode(&frame);
    }
});
