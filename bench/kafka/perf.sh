#!/usr/bin/env bash
# Run Kafka's own perf tools against any Kafka-compatible bootstrap (Kafka or
# Keel) and print their results.
#   usage: perf.sh BOOTSTRAP TOPIC
#   env:   RECORDS (1000000), RECORD_SIZE (100), ACKS (1), PARTITIONS (1),
#          PRODUCER_PROPS (extra producer props, space separated),
#          CLIENT_CONFIG (a client properties file, e.g. security.protocol=SSL,
#            for every Java tool; assign_consume.py reads its librdkafka
#            counterpart from ASSIGN_CONFIG, a JSON object),
#          CONSUMER (kafka|assign|both|none; default both):
#            kafka  = org.apache.kafka.tools.ConsumerPerformance (subscribe:
#                     needs consumer-group APIs on the broker),
#            assign = assign_consume.py (confluent-kafka, manual assignment,
#                     no group APIs needed).
# The topic is created with PARTITIONS partitions if it does not exist.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 BOOTSTRAP TOPIC" >&2
  exit 2
fi
BOOTSTRAP="$1"
TOPIC="$2"
RECORDS="${RECORDS:-1000000}"
RECORD_SIZE="${RECORD_SIZE:-100}"
ACKS="${ACKS:-1}"
PARTITIONS="${PARTITIONS:-1}"
CONSUMER="${CONSUMER:-both}"

HERE="$(cd "$(dirname "$0")" && pwd)"
LAB="${LAB_DIR:-$HERE/../lab}"
"$HERE/fetch.sh" >/dev/null
CP="$LAB/kafka-libs/*"
tool() {
  java -Xmx1g -cp "$CP" -Dlog4j2.configurationFile="$HERE/tools-log4j2.properties" "$@"
}

COMMAND_CONFIG=()
PRODUCER_CONFIG=()
CONSUMER_CONFIG=()
if [[ -n "${CLIENT_CONFIG:-}" ]]; then
  COMMAND_CONFIG=(--command-config "$CLIENT_CONFIG")
  PRODUCER_CONFIG=(--producer.config "$CLIENT_CONFIG")
  CONSUMER_CONFIG=(--consumer.config "$CLIENT_CONFIG")
fi

set -x
tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" "${COMMAND_CONFIG[@]}" \
  --create --if-not-exists --topic "$TOPIC" --partitions "$PARTITIONS" --replication-factor 1

# shellcheck disable=SC2086 # PRODUCER_PROPS is a word list on purpose
tool org.apache.kafka.tools.ProducerPerformance --bootstrap-server "$BOOTSTRAP" "${PRODUCER_CONFIG[@]}" \
  --topic "$TOPIC" --num-records "$RECORDS" --record-size "$RECORD_SIZE" \
  --throughput -1 --command-property acks="$ACKS" ${PRODUCER_PROPS:-}

if [[ "$CONSUMER" == kafka || "$CONSUMER" == both ]]; then
  tool org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$BOOTSTRAP" "${CONSUMER_CONFIG[@]}" \
    --topic "$TOPIC" --num-records "$RECORDS" --timeout 60000 --group "perf-$$-$RANDOM"
fi
if [[ "$CONSUMER" == assign || "$CONSUMER" == both ]]; then
  python3 "$HERE/assign_consume.py" "$BOOTSTRAP" "$TOPIC" "$RECORDS"
fi
