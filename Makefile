# The few commands a newcomer needs. `make test` is what CI runs.
.PHONY: run build test test-rust test-integration lint fmt fuzz

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

# Not part of CI: needs nightly and cargo-fuzz.
fuzz:
	cd fuzz && $(CARGO) +nightly fuzz run decode_request -- -max_total_time=60
