# The few commands a newcomer needs. `make test` is what CI runs.
.PHONY: run build test test-rust test-integration lint fmt fuzz fuzz-seeds

CARGO ?= cargo
PYTHON ?= python3

run: build
	./target/debug/keel serve --data-dir ./data

build:
	$(CARGO) build --workspace --all-targets

test: build test-rust test-integration

test-rust:
	$(CARGO) test --workspace

# Real clients (confluent-kafka, kafka-python) against the keel binary
# built above.
test-integration:
	KEEL_BIN=$(CURDIR)/target/debug/keel $(PYTHON) -m pytest tests -q

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# Fuzzer seeds: a few random valid requests of every supported API and
# version (see crates/keel-protocol/tests/roundtrip.rs).
FUZZ_WORK := fuzz/work/decode_request
fuzz-seeds:
	KEEL_FUZZ_SEED_DIR=$(CURDIR)/$(FUZZ_WORK) $(CARGO) test -p keel-protocol --test roundtrip -- --ignored write_fuzz_seeds

# Not part of CI: needs nightly and cargo-fuzz.
fuzz:
	cd fuzz && $(CARGO) +nightly fuzz run decode_request -- -max_total_time=60
