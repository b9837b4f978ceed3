// A transactional program on Apache Kafka's own Java client, run against a
// broker by tests/test_java_transactions.py:
//   1. a transactional producer writes ROUNDS transactions of 10 records to
//      <in>, committing the even rounds and aborting the odd ones;
//   2. a consume-transform-produce loop copies <in> to <out> in
//      transactions, sending the consumer's offsets with each
//      (sendOffsetsToTransaction with the group's metadata, KIP-447);
//   3. read_committed readers check <out> holds each committed input once
//      and the group's committed offset is past the last committed input;
//   4. the Admin client describes the writer's transactional id: its
//      producer epoch is 0 under the classic protocol and one per ended
//      transaction under transactions v2 (KIP-890), which the client picks
//      when the broker finalizes transaction.version 2.
// Prints one JSON line with what it saw; exits 1 when a check fails.
//
// Usage: java -cp <kafka jars> TxnCopy.java <bootstrap> <in> <out> <group> <rounds>

import java.time.Duration;
import java.util.*;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnCopy {
    static Properties producerProps(String bootstrap, String txnId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return p;
    }

    static KafkaConsumer<String, String> consumer(String bootstrap, String group) {
        return consumer(bootstrap, group, 500);
    }

    static KafkaConsumer<String, String> consumer(String bootstrap, String group, int maxPollRecords) {
        Properties c = new Properties();
        c.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, maxPollRecords);
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        return new KafkaConsumer<>(c);
    }

    /** Every value of a topic a fresh read_committed reader sees up to its end. */
    static List<String> readAll(String bootstrap, String topic) {
        try (KafkaConsumer<String, String> c = consumer(bootstrap, "reader-" + UUID.randomUUID())) {
            List<TopicPartition> parts = new ArrayList<>();
            c.partitionsFor(topic).forEach(i -> parts.add(new TopicPartition(topic, i.partition())));
            c.assign(parts);
            c.seekToBeginning(parts);
            Map<TopicPartition, Long> end = c.endOffsets(parts);
            List<String> out = new ArrayList<>();
            long deadline = System.currentTimeMillis() + 30_000;
            while (parts.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("reading " + topic + " timed out");
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) out.add(r.value());
            }
            return out;
        }
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], in = args[1], out = args[2], group = args[3];
        int rounds = Integer.parseInt(args[4]);

        List<String> committed = new ArrayList<>();
        long lastCommittedOffset = -1;
        try (KafkaProducer<String, String> p = new KafkaProducer<>(producerProps(bootstrap, group + "-writer"))) {
            p.initTransactions();
            for (int round = 0; round < rounds; round++) {
                p.beginTransaction();
                List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
                for (int i = 0; i < 10; i++) {
                    String v = round + "-" + i;
                    sent.add(p.send(new ProducerRecord<>(in, "k" + (i % 3), v)));
                    if (round % 2 == 0) committed.add(v);
                }
                if (round % 2 == 0) {
                    p.commitTransaction();
                    lastCommittedOffset = sent.get(sent.size() - 1).get().offset();
                } else {
                    p.flush();
                    p.abortTransaction();
                }
            }
        }

        int copied = 0, transactions = 0;
        // A few records per poll: the copy takes several transactions.
        try (KafkaConsumer<String, String> c = consumer(bootstrap, group, 7);
             KafkaProducer<String, String> p = new KafkaProducer<>(producerProps(bootstrap, group + "-copier"))) {
            p.initTransactions();
            c.subscribe(List.of(in));
            long deadline = System.currentTimeMillis() + 60_000;
            while (copied < committed.size()) {
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("copied only " + copied);
                ConsumerRecords<String, String> records = c.poll(Duration.ofMillis(500));
                if (records.isEmpty()) continue;
                p.beginTransaction();
                for (ConsumerRecord<String, String> r : records) {
                    p.send(new ProducerRecord<>(out, r.key(), "copy-" + r.value()));
                    copied++;
                }
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (TopicPartition tp : records.partitions()) offsets.put(tp, new OffsetAndMetadata(c.position(tp)));
                p.sendOffsetsToTransaction(offsets, c.groupMetadata());
                p.commitTransaction();
                transactions++;
            }
        }

        List<String> output = readAll(bootstrap, out);
        List<String> expected = new ArrayList<>();
        committed.forEach(v -> expected.add("copy-" + v));
        Collections.sort(output);
        Collections.sort(expected);
        String writer = group + "-writer";
        int writerEpoch;
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
            TransactionDescription d = admin.describeTransactions(List.of(writer)).description(writer).get();
            writerEpoch = d.producerEpoch();
        }
        long committedOffset;
        try (KafkaConsumer<String, String> c = consumer(bootstrap, group)) {
            TopicPartition tp = new TopicPartition(in, 0);
            OffsetAndMetadata o = c.committed(Set.of(tp)).get(tp);
            long end = c.endOffsets(List.of(tp)).get(tp);
            committedOffset = o == null ? -1 : o.offset();
            boolean ok = output.equals(expected) && committedOffset > lastCommittedOffset && committedOffset <= end;
            System.out.printf("{\"committed_inputs\": %d, \"outputs\": %d, \"distinct_outputs\": %d, \"copy_transactions\": %d, \"group_offset\": %d, \"last_committed_input\": %d, \"input_end\": %d, \"writer_epoch\": %d, \"ok\": %b}%n",
                    committed.size(), output.size(), new HashSet<>(output).size(), transactions, committedOffset, lastCommittedOffset, end, writerEpoch, ok);
            System.exit(ok ? 0 : 1);
        }
    }
}
