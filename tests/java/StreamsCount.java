// A Kafka Streams application with processing.guarantee=exactly_once_v2, run
// against a broker by tests/test_java_transactions.py: it counts the records
// of each key of <in> (a state store with its changelog topic, both written
// in the application's transactions) and writes every new count to <out>.
// It runs until a read_committed reader of <out> sees, for every key, the
// count the test expects as the key's last value, then closes. A test may
// kill it and start it again with the same application id and state dir:
// exactly-once means the counts still end exactly there.
// Prints one JSON line; exits 1 if the counts are not reached in time.
//
// Usage: java -cp <kafka jars> StreamsCount.java <bootstrap> <in> <out> <app id> <state dir> <keys> <per key>

import java.time.Duration;
import java.util.*;

import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.*;
import org.apache.kafka.streams.*;
import org.apache.kafka.streams.kstream.*;

public class StreamsCount {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], in = args[1], out = args[2], app = args[3], stateDir = args[4];
        int keys = Integer.parseInt(args[5]);
        long perKey = Long.parseLong(args[6]);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(in, Consumed.with(Serdes.String(), Serdes.String()))
                .groupByKey()
                .count(Materialized.as("counts"))
                .toStream()
                .to(out, Produced.with(Serdes.String(), Serdes.Long()));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        // A killed instance's members leave the group by their session
        // timeout: keep it short so its successor takes over soon.
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 500);

        Map<String, Long> last = new TreeMap<>();
        boolean done = false;
        long start = System.currentTimeMillis();
        try (KafkaStreams streams = new KafkaStreams(builder.build(), props)) {
            streams.start();
            Properties c = new Properties();
            c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            c.put(ConsumerConfig.GROUP_ID_CONFIG, app + "-checker-" + UUID.randomUUID());
            c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
            c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            try (KafkaConsumer<String, Long> reader = new KafkaConsumer<>(c, new StringDeserializer(), new LongDeserializer())) {
                reader.subscribe(List.of(out));
                long deadline = start + 120_000;
                while (!done && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<String, Long> r : reader.poll(Duration.ofMillis(200))) last.put(r.key(), r.value());
                    done = last.size() == keys && last.values().stream().allMatch(v -> v == perKey);
                    if (streams.state() == KafkaStreams.State.ERROR) break;
                }
            }
            System.out.printf("{\"keys\": %d, \"reached\": %b, \"state\": \"%s\", \"seconds\": %.1f, \"last\": \"%s\"}%n",
                    last.size(), done, streams.state(), (System.currentTimeMillis() - start) / 1000.0, last);
            streams.close(Duration.ofSeconds(30));
        }
        System.exit(done ? 0 : 1);
    }
}
