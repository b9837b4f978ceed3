#!/usr/bin/env bash
# Stop the lab Kafka started by start.sh: SIGTERM, wait for a clean shutdown,
# SIGKILL after KAFKA_STOP_TIMEOUT_S (default 60).
#   usage: stop.sh [DATADIR]     (default bench/lab/kafka-data)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LAB="${LAB_DIR:-$HERE/../lab}"
DATADIR="${1:-$LAB/kafka-data}"
PIDFILE="$DATADIR/kafka.pid"
TIMEOUT_S="${KAFKA_STOP_TIMEOUT_S:-60}"
# A killed broker may linger as a zombie until init reaps it: not running.
running() {
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [[ -n "$state" && "$state" != Z ]]
}

if [[ ! -f "$PIDFILE" ]]; then
  echo "no $PIDFILE; nothing to stop"
  exit 0
fi
PID="$(cat "$PIDFILE")"
if ! running "$PID"; then
  echo "kafka (pid $PID) not running"
  rm -f "$PIDFILE"
  exit 0
fi
kill -TERM "$PID"
deadline=$((SECONDS + TIMEOUT_S))
while running "$PID"; do
  if ((SECONDS >= deadline)); then
    echo "kafka (pid $PID) still up after ${TIMEOUT_S}s; SIGKILL" >&2
    kill -KILL "$PID" 2>/dev/null || true
    break
  fi
  sleep 0.2
done
rm -f "$PIDFILE"
echo "kafka (pid $PID) stopped"
