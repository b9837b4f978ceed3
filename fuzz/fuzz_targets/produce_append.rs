//! Produce validation and append, driven through the log's simulated
//! storage by structure read from the bytes (`keel_broker::fuzzing`):
//! forged batches, reads, retention, seals, injected faults and power
//! losses. Nothing may panic, and the log must keep its invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    keel_broker::fuzzing::produce_append(data);
});
