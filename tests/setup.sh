#!/usr/bin/env bash
# Installs what the build needs besides cargo (protoc) and what the test
# suite drives besides python3: kcat, etcd, Prometheus, Go, versitygw, the
# Python test dependencies and Apache Kafka's jars (bench/kafka/fetch.sh).
# `make test` runs it first, on CI's fresh Debian machine (.ci/run) and on a developer's alike. Idempotent: what is
# there already is left alone, so on a set-up machine it only checks.
#
# System packages come from apt-get (through sudo when not root). Without
# apt-get a missing tool is reported and left out: its tests are skipped,
# except under CI=true, where they fail.
#
#   tests/setup.sh                    install what is missing
#   tests/setup.sh --versitygw-path   print the versitygw binary it installs,
#                                     if it is there (the Makefile passes it
#                                     to the tests as KEEL_VERSITYGW)
set -euo pipefail

cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VERSITYGW_VERSION=v1.8.0

# The tiered-storage tests' S3 server (tests/s3server.py) is versitygw. It
# goes where `go install` puts it by default, and KEEL_VERSITYGW tells the
# tests which binary to run.
versitygw_bin() {
  local dir
  dir="$(go env GOBIN)"
  [[ -n "$dir" ]] || dir="$(go env GOPATH | cut -d: -f1)/bin"
  echo "$dir/versitygw"
}

if [[ "${1:-}" == "--versitygw-path" ]]; then
  if command -v go >/dev/null 2>&1 && [[ -x "$(versitygw_bin)" ]]; then
    versitygw_bin
  fi
  exit 0
fi

APT_UPDATED=false
# Installs Debian packages (options first, then names), or says what to
# install by hand where there is no apt-get. Called after `||`, where set -e
# does not reach, hence the explicit exits.
apt_install() {
  local names=() a
  for a in "$@"; do [[ "$a" == -* ]] || names+=("$a"); done
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "!! no apt-get here: install ${names[*]} by hand; the tests that need it" \
      "are skipped (and fail under CI=true)" >&2
    return 0
  fi
  # sudo resets the environment, so the variable goes through env.
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
  [[ "$(id -u)" == 0 ]] || apt=(sudo "${apt[@]}")
  echo "== apt-get install ${names[*]}"
  if [[ "$APT_UPDATED" == false ]]; then
    "${apt[@]}" update -q || exit 1
    APT_UPDATED=true
  fi
  "${apt[@]}" install -y -q "$@" || exit 1
}

have() { command -v "$1" >/dev/null 2>&1; }

have kcat || apt_install kcat

# The build needs protoc: the etcd-client crate compiles etcd's protos.
have protoc || apt_install --no-install-recommends protobuf-compiler

# tests/test_cluster.py runs brokers on a real etcd (Debian's etcd-server;
# the tests start their own on loopback ports, not the package's service).
have etcd || apt_install --no-install-recommends etcd-server

# tests/test_metrics.py scrapes a running Keel with a real Prometheus
# server (Debian's package; the test starts it, the package's own service
# is not used).
have prometheus || apt_install --no-install-recommends prometheus

# bench/keel-bench (tests/test_bench_smoke.py) is built with Go. A Debian
# golang-go of 1.21 or newer fetches the toolchain go.mod asks for
# (GOTOOLCHAIN=auto, through the Go module proxy).
have go || apt_install golang-go

# versitygw is built from source with the Go above (2 to 2.5 minutes on 2
# cores, most of it compiling; ~190 MB of modules).
# `versitygw --version` says "git" when built by go install; the module
# version is in the binary's build info.
versitygw_version() {
  go version -m "$(versitygw_bin)" 2>/dev/null |
    awk '$1 == "mod" && $2 == "github.com/versity/versitygw" { print $3 }'
}
if have go && [[ "$(versitygw_version)" != "$VERSITYGW_VERSION" ]]; then
  echo "== go install versitygw@$VERSITYGW_VERSION"
  GOBIN="$(dirname "$(versitygw_bin)")" go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
fi

# A dry run against no index succeeds only when every requirement is
# already met, and (with --report) is not refused by a PEP 668 system
# python, so a set-up machine installs nothing.
PIP=("$PYTHON" -m pip install -q --disable-pip-version-check -r tests/requirements.txt)
if ! "${PIP[@]}" --dry-run --no-index --report /dev/null >/dev/null 2>&1; then
  echo "== pip install -r tests/requirements.txt"
  # A Debian system python refuses global installs (PEP 668); CI's machine
  # is throwaway, so fall back to --break-system-packages there. Elsewhere,
  # run `make test` in a virtualenv (PYTHON=.venv/bin/python3).
  if ! PIP_ROOT_USER_ACTION=ignore "${PIP[@]}"; then
    if [[ "${CI:-}" != true ]]; then
      echo "!! pip install failed; in a virtualenv: make test PYTHON=.venv/bin/python3" >&2
      exit 1
    fi
    PIP_ROOT_USER_ACTION=ignore "${PIP[@]}" --break-system-packages
  fi
fi

# Apache Kafka's own tools (DumpLogSegments checks cleaned segments) come
# from the jars bench/kafka/fetch.sh resolves from Maven Central (~1 minute,
# ~55 MB). Java 17 and Maven are on the machine; install them if not.
if ! have java || ! have mvn; then
  apt_install openjdk-17-jdk-headless maven
fi
if have mvn; then
  bash bench/kafka/fetch.sh
fi

echo "== toolchain"
# Each line only for a tool that is there; a missing one was reported above.
have cargo && cargo --version
"$PYTHON" --version
have go && go version
have kcat && kcat -V | grep -i version
have protoc && protoc --version
have etcd && etcd --version | sed -n 1p
have prometheus && prometheus --version 2>&1 | sed -n 1p
have java && java -version 2>&1 | sed -n 1p
have go && echo "versitygw $(versitygw_version) at $(versitygw_bin)"
"$PYTHON" -c 'import confluent_kafka, kafka; print("confluent-kafka", confluent_kafka.__version__, "librdkafka", confluent_kafka.libversion()[0], "kafka-python", kafka.__version__)'
