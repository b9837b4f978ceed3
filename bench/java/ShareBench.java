// Share groups (KIP-932) under load, on Apache Kafka's own Java client
// (KafkaShareConsumer), driven by bench/share_groups.py. Modes:
//
//   throughput <bootstrap> <topic> <group> <consumers> <partitions> <records> <record_size> <warmup> <timeout_s>
//       <consumers> implicit-acknowledgement share consumers, one thread
//       each, join <group> on the empty <topic> (<partitions> partitions)
//       and wait until every member has its part of the group's last
//       assignment; <warmup> records then (at least one per partition),
//       read by the group, show every share partition exists and warm up
//       the client's JIT and the broker. The consumers stop polling while
//       this program produces <records> records of <record_size> bytes
//       (round robin over the partitions), and the clock starts when they
//       are let go: they poll until every record was delivered, then
//       commitSync() the last acknowledgements. Prints one JSON line:
//       seconds to the last record delivered and to the last
//       acknowledgement committed, records/s of both, records per
//       consumer, partitions per member before and after, records
//       delivered again, failed acknowledgements and their errors.
//   race <bootstrap> <topic> <group> <timeout_s>
//       one explicit-acknowledgement share consumer of a one-partition
//       <topic>, run twice at once: prints READY once the group has two
//       members with partitions; then the one that gets the first records
//       holds them: prints HELD <json> with their values, their timestamp
//       (the broker's append time with LogAppendTime: their acquisition by
//       a fetch waiting for them, within a wake-up) and the wall-clock ms
//       its poll returned them, and never polls or acknowledges again (the
//       caller stops it). The other keeps polling, accepts what comes to it a
//       second time (delivery count 2 or more) and prints AGAIN <value>
//       <wall-clock ms> for each, until <timeout_s> or it is killed.
//
// Exits 1 when the run fails (a timeout, a client error).

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import java.util.function.BooleanSupplier;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ShareBench {
    /** Digits of a record's id at the start of its value. */
    static final int ID_DIGITS = 10;
    /** A warm-up (probe) record's id: not a timed record. */
    static final int PROBE = -1;

    static KafkaShareConsumer<byte[], byte[]> consumer(String bootstrap, String group, boolean implicit) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, implicit ? "implicit" : "explicit");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return new KafkaShareConsumer<>(c);
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, 64 * 1024);
        return new KafkaProducer<>(p);
    }

    /** A value of `size` bytes (at least ID_DIGITS) that starts with `id`. */
    static byte[] value(int id, int size) {
        byte[] v = new byte[Math.max(size, ID_DIGITS)];
        Arrays.fill(v, (byte) 'x');
        byte[] digits = String.format("%0" + ID_DIGITS + "d", id).getBytes(StandardCharsets.US_ASCII);
        System.arraycopy(digits, 0, v, 0, ID_DIGITS);
        if (id == PROBE) v[0] = 'p';
        return v;
    }

    /** The id a value starts with; PROBE for a probe record. */
    static int id(byte[] v) {
        if (v[0] == 'p') return PROBE;
        int n = 0;
        for (int i = 0; i < ID_DIGITS; i++) n = n * 10 + (v[i] - '0');
        return n;
    }

    /**
     * Waits until `group` has `members` members, each assigned partitions
     * and each at the target assignment's epoch: every member has been
     * sent its part of the last assignment. (Until its next heartbeat a
     * member fetches the partitions it was given before, which another
     * member may have been given since.)
     */
    static void awaitAssigned(String bootstrap, String group, int members) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            long deadline = System.currentTimeMillis() + 120_000;
            while (true) {
                try {
                    ShareGroupDescription d = admin.describeShareGroups(List.of(group))
                        .describedGroups().get(group).get();
                    int target = d.targetAssignmentEpoch();
                    boolean settled = d.groupEpoch() == target && d.members().stream()
                        .allMatch(m -> m.memberEpoch() == target && !m.assignment().topicPartitions().isEmpty());
                    if (d.members().size() >= members && settled) return;
                } catch (ExecutionException e) {
                    // Not there yet.
                }
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("no assignment for " + group);
                Thread.sleep(50);
            }
        }
    }

    static Admin admin(String bootstrap) {
        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return Admin.create(a);
    }

    /** How many partitions each member of `group` is assigned, as the group coordinator says. */
    static List<Integer> assignment(String bootstrap, String group) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            ShareGroupDescription d = admin.describeShareGroups(List.of(group)).describedGroups().get(group).get();
            return d.members().stream().map(m -> m.assignment().topicPartitions().size()).sorted().toList();
        }
    }

    /** A JSON object of string keys. */
    static String quoted(Map<String, ?> m) {
        Map<String, Object> q = new LinkedHashMap<>();
        m.forEach((k, v) -> q.put(k.replace("\\", "\\\\").replace("\"", "\\\""), v));
        return json(q);
    }

    static String json(Map<String, Object> m) {
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<String, Object> e : m.entrySet()) {
            if (b.length() > 1) b.append(", ");
            b.append('"').append(e.getKey()).append("\": ").append(e.getValue());
        }
        return b.append('}').toString();
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "throughput" -> new Throughput(args[1], args[2], args[3], Integer.parseInt(args[4]),
                Integer.parseInt(args[5]), Integer.parseInt(args[6]), Integer.parseInt(args[7]))
                .run(Integer.parseInt(args[8]), Integer.parseInt(args[9]));
            case "race" -> race(args[1], args[2], args[3], Integer.parseInt(args[4]));
            default -> throw new IllegalArgumentException(args[0]);
        }
    }

    /** The `throughput` mode (see the file's comment). */
    static class Throughput {
        final String bootstrap, topic, group;
        final int consumers, partitions, records, recordSize;
        final AtomicIntegerArray seen;
        final AtomicInteger distinct = new AtomicInteger();
        final AtomicInteger probes = new AtomicInteger();
        final AtomicInteger again = new AtomicInteger();
        final AtomicInteger failedAcks = new AtomicInteger();
        /** Failed acknowledgements by error (the broker's or the client's). */
        final ConcurrentHashMap<String, Integer> ackErrors = new ConcurrentHashMap<>();
        final int[] got;
        final List<KafkaShareConsumer<byte[], byte[]>> all = new CopyOnWriteArrayList<>();
        final List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        /** Once set, consumers stop polling and wait for `go`. */
        volatile boolean park;
        final CountDownLatch parked, go = new CountDownLatch(1), finished, release = new CountDownLatch(1);
        volatile long lastRecordNs, startNs;
        final long[] ackedNs;

        Throughput(String bootstrap, String topic, String group, int consumers, int partitions, int records,
                   int recordSize) {
            this.bootstrap = bootstrap;
            this.topic = topic;
            this.group = group;
            this.consumers = consumers;
            this.partitions = partitions;
            this.records = records;
            this.recordSize = recordSize;
            seen = new AtomicIntegerArray(records);
            got = new int[consumers];
            ackedNs = new long[consumers];
            parked = new CountDownLatch(consumers);
            finished = new CountDownLatch(consumers);
        }

        void run(int warmup, int timeoutS) throws Exception {
            List<Thread> threads = new ArrayList<>();
            for (int i = 0; i < consumers; i++) {
                final int me = i;
                Thread t = new Thread(() -> member(me));
                t.start();
                threads.add(t);
            }
            awaitAssigned(bootstrap, group, consumers);
            List<Integer> assignedAtStart = assignment(bootstrap, group);
            long produceNs;
            try (KafkaProducer<byte[], byte[]> p = producer(bootstrap)) {
                int warm = Math.max(warmup, partitions);
                List<Future<RecordMetadata>> warming = new ArrayList<>(warm);
                for (int i = 0; i < warm; i++) {
                    warming.add(p.send(new ProducerRecord<>(topic, i % partitions, null, value(PROBE, recordSize))));
                }
                for (Future<RecordMetadata> f : warming) f.get();
                await(() -> probes.get() >= warm, timeoutS, "warm-up records");
                park = true;
                if (!parked.await(timeoutS, TimeUnit.SECONDS)) throw new IllegalStateException("consumers did not park");
                long t0 = System.nanoTime();
                List<Future<RecordMetadata>> sent = new ArrayList<>(records);
                for (int id = 0; id < records; id++) {
                    sent.add(p.send(new ProducerRecord<>(topic, id % partitions, null, value(id, recordSize))));
                }
                for (Future<RecordMetadata> f : sent) f.get();
                produceNs = System.nanoTime() - t0;
            }
            startNs = System.nanoTime();
            go.countDown();
            finished.await(timeoutS, TimeUnit.SECONDS);
            List<Integer> assignedAtEnd = assignment(bootstrap, group);
            release.countDown();
            for (Thread t : threads) t.join(timeoutS * 1000L);
            boolean complete = distinct.get() == records;
            for (Throwable e : errors) e.printStackTrace();
            double toLast = (lastRecordNs - startNs) / 1e9;
            double toAcked = (Arrays.stream(ackedNs).max().orElse(0) - startNs) / 1e9;
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("consumers", consumers);
            out.put("records", records);
            out.put("complete", complete);
            out.put("produce_s", produceNs / 1e9);
            out.put("to_last_record_s", complete ? toLast : -1);
            out.put("to_acknowledged_s", complete ? toAcked : -1);
            out.put("records_per_s", complete ? records / toLast : 0);
            out.put("acknowledged_records_per_s", complete ? records / toAcked : 0);
            out.put("per_consumer", Arrays.toString(got));
            out.put("partitions_per_member", List.of(assignedAtStart, assignedAtEnd));
            out.put("delivered_again", again.get());
            out.put("failed_acknowledgements", failedAcks.get());
            out.put("acknowledgement_errors", quoted(ackErrors));
            out.put("errors", errors.size());
            System.out.println(json(out));
            System.exit(errors.isEmpty() && complete ? 0 : 1);
        }

        /** One consumer's thread: join and poll, park, then read until every record came. */
        void member(int me) {
            try (KafkaShareConsumer<byte[], byte[]> c = consumer(bootstrap, group, true)) {
                all.add(c);
                c.setAcknowledgementCommitCallback((offsets, e) -> {
                    if (e == null) return;
                    int n = offsets.values().stream().mapToInt(Set::size).sum();
                    failedAcks.addAndGet(n);
                    ackErrors.merge(e.getClass().getSimpleName() + ": " + e.getMessage(), n, Integer::sum);
                });
                c.subscribe(List.of(topic));
                while (!park) {
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(100))) {
                        if (id(r.value()) == PROBE) probes.incrementAndGet();
                    }
                }
                parked.countDown();
                go.await();
                try {
                    while (distinct.get() < records) {
                        for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) deliver(me, r);
                    }
                } catch (WakeupException e) {
                    // Every record came: stop polling.
                }
                // Implicit acknowledgement: the last poll's records are
                // acknowledged by the next poll or by this. A wakeup meant
                // for a poll that did not come lands here once.
                try {
                    c.commitSync(Duration.ofSeconds(30));
                } catch (WakeupException e) {
                    c.commitSync(Duration.ofSeconds(30));
                }
                ackedNs[me] = System.nanoTime();
                finished.countDown();
                // Still a member while the assignment is read again.
                release.await();
            } catch (Throwable e) {
                errors.add(e);
                all.forEach(KafkaShareConsumer::wakeup);
                finished.countDown();
            }
        }

        void deliver(int me, ConsumerRecord<byte[], byte[]> r) {
            got[me]++;
            int id = id(r.value());
            if (id == PROBE) return;
            if (r.deliveryCount().map(n -> n > 1).orElse(false)) again.incrementAndGet();
            if (seen.getAndIncrement(id) == 0 && distinct.incrementAndGet() == records) {
                lastRecordNs = System.nanoTime();
                all.forEach(KafkaShareConsumer::wakeup);
            }
        }
    }

    static void await(BooleanSupplier check, int timeoutS, String what) throws InterruptedException {
        long deadline = System.currentTimeMillis() + timeoutS * 1000L;
        while (!check.getAsBoolean()) {
            if (System.currentTimeMillis() > deadline) throw new IllegalStateException("timed out waiting for " + what);
            Thread.sleep(5);
        }
    }

    /** The `race` mode (see the file's comment). */
    static void race(String bootstrap, String topic, String group, int timeoutS) throws Exception {
        KafkaShareConsumer<byte[], byte[]> c = consumer(bootstrap, group, false);
        c.subscribe(List.of(topic));
        ExecutorService bg = Executors.newSingleThreadExecutor();
        Future<?> ready = bg.submit(() -> { awaitAssigned(bootstrap, group, 2); return null; });
        while (!ready.isDone()) c.poll(Duration.ofMillis(100));
        ready.get();
        bg.shutdown();
        System.out.println("READY");
        System.out.flush();
        boolean taker = false;
        long deadline = System.currentTimeMillis() + timeoutS * 1000L;
        while (System.currentTimeMillis() < deadline) {
            ConsumerRecords<byte[], byte[]> records = c.poll(Duration.ofMillis(100));
            long nowMs = System.currentTimeMillis();
            List<Integer> first = new ArrayList<>();
            long appendMs = 0;
            for (ConsumerRecord<byte[], byte[]> r : records) {
                if (r.deliveryCount().map(n -> n > 1).orElse(false)) {
                    taker = true;
                    c.acknowledge(r, AcknowledgeType.ACCEPT);
                    System.out.println("AGAIN " + id(r.value()) + " " + nowMs);
                } else {
                    first.add(id(r.value()));
                    appendMs = Math.max(appendMs, r.timestamp());
                }
            }
            System.out.flush();
            if (!first.isEmpty() && !taker) {
                System.out.println("HELD {\"values\": " + first + ", \"append_ms\": " + appendMs
                    + ", \"polled_ms\": " + nowMs + "}");
                System.out.flush();
                // Holds them until stopped or killed: no acknowledgement, no poll.
                Thread.sleep(Long.MAX_VALUE);
            }
            if (!records.isEmpty()) c.commitAsync();
        }
        System.exit(1);
    }
}
