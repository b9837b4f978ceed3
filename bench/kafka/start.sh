#!/usr/bin/env bash
# Start a single-node Apache Kafka (KRaft, combined broker+controller) for
# comparison with Keel. Listens on 127.0.0.1 only: PLAINTEXT on PORT, the
# controller on PORT+1. Formats DATADIR on first use; writes DATADIR/kafka.pid.
#   usage: start.sh [PORT] [DATADIR]     (defaults 9092, bench/lab/kafka-data)
#   env:   KAFKA_HEAP (default 1g), KAFKA_START_TIMEOUT_S (default 60),
#          KAFKA_EXTRA_PROPS (extra server.properties lines, newline separated),
#          KAFKA_JMX_PORT (serve JMX, without auth, on 127.0.0.1 at this port:
#          Kafka's own request metrics, read with its JmxTool)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LAB="${LAB_DIR:-$HERE/../lab}"
PORT="${1:-9092}"
DATADIR="${2:-$LAB/kafka-data}"
HEAP="${KAFKA_HEAP:-1g}"
TIMEOUT_S="${KAFKA_START_TIMEOUT_S:-60}"
CONTROLLER_PORT=$((PORT + 1))

"$HERE/fetch.sh" >/dev/null
CP="$LAB/kafka-libs/*"
mkdir -p "$DATADIR"
DATADIR="$(cd "$DATADIR" && pwd)"
PIDFILE="$DATADIR/kafka.pid"
# A killed broker may linger as a zombie until init reaps it: not running.
running() {
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [[ -n "$state" && "$state" != Z ]]
}

if [[ -f "$PIDFILE" ]] && running "$(cat "$PIDFILE")"; then
  echo "kafka already running (pid $(cat "$PIDFILE"))" >&2
  exit 1
fi

cat >"$DATADIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DATADIR/logs
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
${KAFKA_EXTRA_PROPS:-}
PROPS

JAVA_LOG=(-Dkafka.logs.dir="$DATADIR" -Dlog4j2.configurationFile="$HERE/log4j2.properties")
JMX=()
if [[ -n "${KAFKA_JMX_PORT:-}" ]]; then
  JMX=(-Dcom.sun.management.jmxremote
       -Dcom.sun.management.jmxremote.host=127.0.0.1
       -Dcom.sun.management.jmxremote.port="$KAFKA_JMX_PORT"
       -Dcom.sun.management.jmxremote.rmi.port="$KAFKA_JMX_PORT"
       -Dcom.sun.management.jmxremote.authenticate=false
       -Dcom.sun.management.jmxremote.ssl=false
       -Djava.rmi.server.hostname=127.0.0.1)
fi

if [[ ! -f "$DATADIR/logs/meta.properties" ]]; then
  CLUSTER_ID="$(java -cp "$CP" "${JAVA_LOG[@]}" kafka.tools.StorageTool random-uuid)"
  java -cp "$CP" "${JAVA_LOG[@]}" kafka.tools.StorageTool format \
    -t "$CLUSTER_ID" -c "$DATADIR/server.properties" >"$DATADIR/format.out"
fi

nohup java -Xms"$HEAP" -Xmx"$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
  -Djava.awt.headless=true "${JAVA_LOG[@]}" ${JMX[@]+"${JMX[@]}"} -cp "$CP" \
  kafka.Kafka "$DATADIR/server.properties" \
  >"$DATADIR/stdout.log" 2>"$DATADIR/stderr.log" </dev/null &
echo $! >"$PIDFILE"

deadline=$((SECONDS + TIMEOUT_S))
until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
  if ! running "$(cat "$PIDFILE")"; then
    echo "kafka exited during startup; see $DATADIR/stderr.log, $DATADIR/server.log" >&2
    tail -20 "$DATADIR/stderr.log" >&2 || true
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "kafka did not listen on 127.0.0.1:$PORT within ${TIMEOUT_S}s" >&2
    exit 1
  fi
  sleep 0.2
done
echo "kafka listening on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"), data $DATADIR)"
