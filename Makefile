# The few commands a newcomer needs. `make test` is what CI runs (.ci/run).
.PHONY: run build setup test test-rust test-integration lint fmt fuzz fuzz-seeds fuzz-cmin

CARGO ?= cargo
PYTHON ?= python3

run: build
	./target/debug/keel serve --data-dir ./data

build:
	$(CARGO) build --workspace --all-targets

# Installs what the tests drive (kcat, Prometheus, Go, versitygw, the
# Python packages, Kafka's jars) where it is missing, then runs them all.
test: setup build test-rust test-integration

setup:
	PYTHON=$(PYTHON) bash tests/setup.sh

test-rust:
	$(CARGO) test --workspace

# Real clients (confluent-kafka, kafka-python) against the keel binary
# built above. The tests look for versitygw on PATH and in Go's default bin
# directories; KEEL_VERSITYGW, when not set already, names the one
# tests/setup.sh installed, wherever `go env` put it.
test-integration:
	KEEL_VERSITYGW="$${KEEL_VERSITYGW:-$$(bash tests/setup.sh --versitygw-path)}" \
		KEEL_BIN=$(CURDIR)/target/debug/keel $(PYTHON) -m pytest tests -q

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# Fuzzing (not part of CI: needs nightly and cargo-fuzz). Targets:
# decode_request (request decoding) and produce_append (produce validation
# and append through the log's simulated storage); FUZZ_TARGET picks one.
# New inputs land in fuzz/work (ignored by git); `make fuzz-cmin` folds
# them into the committed corpus, which `cargo test` replays
# (keel-protocol's tests/fuzz_corpus.rs, keel-broker's tests/fuzz_corpus.rs).
# Crash inputs go to fuzz/regressions/<target>.
FUZZ_SECONDS ?= 600
FUZZ_TARGET ?= decode_request
FUZZ_DIR := $(CURDIR)/fuzz
FUZZ_WORK := $(FUZZ_DIR)/work/$(FUZZ_TARGET)
FUZZ_INPUTS := $(FUZZ_DIR)/corpus/$(FUZZ_TARGET) $(wildcard $(FUZZ_DIR)/regressions/$(FUZZ_TARGET))

# Seeds for decode_request: a few random valid requests of every supported
# API and version (crates/keel-protocol/tests/roundtrip.rs) and the frames
# captured from real clients (tests/tools/capture_frames.py).
fuzz-seeds:
	KEEL_FUZZ_SEED_DIR=$(FUZZ_DIR)/work/decode_request $(CARGO) test -p keel-protocol --test roundtrip -- --ignored write_fuzz_seeds
	cp crates/keel-protocol/tests/fixtures/frames/*.bin $(FUZZ_DIR)/work/decode_request/

fuzz:
	mkdir -p $(FUZZ_WORK)
	cd fuzz && nice -n 10 $(CARGO) +nightly fuzz run $(FUZZ_TARGET) $(FUZZ_WORK) $(FUZZ_INPUTS) -- \
		-max_total_time=$(FUZZ_SECONDS) -print_final_stats=1

# Keeps the inputs that cover new edges (edge coverage only, so the
# committed corpus stays small).
fuzz-cmin:
	cp $(FUZZ_WORK)/* $(FUZZ_DIR)/corpus/$(FUZZ_TARGET)/
	cd fuzz && $(CARGO) +nightly fuzz cmin $(FUZZ_TARGET) $(FUZZ_DIR)/corpus/$(FUZZ_TARGET) -- -use_counters=0
