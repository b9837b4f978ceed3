#!/usr/bin/env bash
# Resolve Apache Kafka (broker, tools, Kafka Streams and a log4j2 binding)
# from Maven Central into bench/lab/kafka-libs/. Idempotent: does nothing when
# the jars are there.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.3.1}"
LOG4J_VERSION="${LOG4J_VERSION:-2.24.3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
LAB="${LAB_DIR:-$HERE/../lab}"
LIBS="$LAB/kafka-libs"
# Names what the set holds: a set fetched before Kafka Streams was added is
# fetched again.
COMPLETE="$LIBS/.complete-$KAFKA_VERSION-streams"

if [[ -f "$COMPLETE" ]]; then
  echo "kafka $KAFKA_VERSION already in $LIBS"
  exit 0
fi

mkdir -p "$LAB"
WORK="$(mktemp -d "$LAB/fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

cat >"$WORK/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>keel.bench</groupId>
  <artifactId>kafka-lab</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-streams</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
POM

rm -rf "$LIBS"
mvn -B -q -f "$WORK/pom.xml" dependency:copy-dependencies \
  -DoutputDirectory="$LIBS" -DincludeScope=runtime
# Kafka 4.3 pins slf4j-api 1.7.x, so the log4j2 binding is the slf4j 1.x one
# (log4j-slf4j-impl); the slf4j2 one would be ignored. Drop other bindings.
rm -f "$LIBS"/slf4j-reload4j-*.jar "$LIBS"/slf4j-log4j12-*.jar
touch "$COMPLETE"
echo "kafka $KAFKA_VERSION: $(ls "$LIBS"/*.jar | wc -l) jars in $LIBS"
