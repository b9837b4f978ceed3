// Share groups (KIP-932) on Apache Kafka's own Java client, run against a
// broker by tests/test_share_groups.py. Modes:
//
//   produce <bootstrap> <topic> <first> <count>
//       writes values first..first+count-1 (as decimal strings), keyed by
//       value, and waits for every acknowledgement;
//   hold <bootstrap> <topic> <group>
//       one explicit-acknowledgement share consumer: prints READY once the
//       group assigned it partitions, then HELD <json> with the values of
//       the first records it gets, and holds them (never acknowledges)
//       until it is killed or stopped;
//   poll <bootstrap> <topic> <group> <properties-file> <timeout_s>
//       one implicit-acknowledgement share consumer with the client
//       properties in the file (security, say) polls until it gets
//       records, an exception, or the timeout, and prints GOT <n>,
//       ERROR <exception class> or NONE;
//   renew <bootstrap> <topic> <group> <expected> <hold_ms> <timeout_s>
//       one explicit-acknowledgement share consumer in the record_limit
//       acquire mode (max.poll.records 4) renews each record's lock
//       (AcknowledgeType.RENEW) until it has held it <hold_ms>, then
//       accepts it, until <expected> values are accepted; prints one
//       JSON line: values accepted, renewals, the highest delivery count
//       seen and the most records one poll returned;
//   consume <bootstrap> <topic> <group> <explicit|implicit|release> <consumers> <expected> <timeout_s> [limit]
//       <consumers> share consumers in threads print READY once the group
//       assigned each of them partitions, then read until <expected>
//       distinct values are done with. In explicit mode each value v is
//       rejected when v % 10 == 0, released on its first delivery when
//       v % 7 == 0, else accepted; implicit mode accepts everything;
//       release mode releases every record, and a value is done once
//       delivered <limit> times (the broker's delivery count limit).
//       Prints one JSON line: values accepted (and how often), rejected
//       (or, releasing, done), the highest delivery count seen, records
//       delivered again after their value was done, and the records each
//       consumer got.
//
// Exits 1 when a check fails.

import java.time.Duration;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class ShareConsume {
    static KafkaShareConsumer<String, String> consumer(String bootstrap, String group, String mode) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, mode.equals("implicit") ? "implicit" : "explicit");
        c.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 50);
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        return new KafkaShareConsumer<>(c);
    }

    /** Waits until the group has `members` members, each assigned partitions. */
    static void awaitAssigned(String bootstrap, String group, int members) throws Exception {
        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(a)) {
            long deadline = System.currentTimeMillis() + 60_000;
            while (true) {
                try {
                    ShareGroupDescription d = admin.describeShareGroups(List.of(group))
                        .describedGroups().get(group).get();
                    long assigned = d.members().stream()
                        .filter(m -> !m.assignment().topicPartitions().isEmpty()).count();
                    if (d.members().size() >= members && assigned >= members) return;
                } catch (ExecutionException e) {
                    // Not there yet.
                }
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("no assignment for " + group);
                Thread.sleep(100);
            }
        }
    }

    static void produce(String bootstrap, String topic, int first, int count) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int v = first; v < first + count; v++) {
                sent.add(producer.send(new ProducerRecord<>(topic, Integer.toString(v), Integer.toString(v))));
            }
            for (Future<RecordMetadata> f : sent) f.get();
        }
    }

    static void hold(String bootstrap, String topic, String group) throws Exception {
        KafkaShareConsumer<String, String> c = consumer(bootstrap, group, "explicit");
        c.subscribe(List.of(topic));
        ExecutorService bg = Executors.newSingleThreadExecutor();
        Future<?> ready = bg.submit(() -> { awaitAssigned(bootstrap, group, 1); return null; });
        while (!ready.isDone()) c.poll(Duration.ofMillis(100));
        ready.get();
        System.out.println("READY");
        System.out.flush();
        List<Integer> held = new ArrayList<>();
        long deadline = System.currentTimeMillis() + 60_000;
        while (held.isEmpty()) {
            if (System.currentTimeMillis() > deadline) throw new IllegalStateException("nothing to hold");
            for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) held.add(Integer.parseInt(r.value()));
        }
        System.out.println("HELD {\"values\": " + held + "}");
        System.out.flush();
        // Holds the records: the heartbeat thread keeps the member alive.
        Thread.sleep(Long.MAX_VALUE);
    }

    static void poll(String bootstrap, String topic, String group, String propertiesFile, int timeoutS)
            throws Exception {
        Properties c = new Properties();
        try (java.io.FileReader r = new java.io.FileReader(propertiesFile)) {
            c.load(r);
        }
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        String outcome = "NONE";
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(c)) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + timeoutS * 1000L;
            while (System.currentTimeMillis() < deadline) {
                int n = consumer.poll(Duration.ofMillis(200)).count();
                if (n > 0) {
                    outcome = "GOT " + n;
                    break;
                }
            }
        } catch (org.apache.kafka.common.KafkaException e) {
            outcome = "ERROR " + e.getClass().getSimpleName();
        }
        System.out.println(outcome);
    }

    static void renew(String bootstrap, String topic, String group, int expected, long holdMs, int timeoutS)
            throws Exception {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
        c.put("share.acquire.mode", "record_limit");
        c.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 4);
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Map<Integer, Long> firstSeen = new HashMap<>();
        Set<Integer> accepted = new TreeSet<>();
        int renewals = 0, maxDelivery = 0, mostInPoll = 0;
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(c)) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + timeoutS * 1000L;
            while (accepted.size() < expected) {
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("accepted " + accepted);
                ConsumerRecords<String, String> got = consumer.poll(Duration.ofMillis(200));
                mostInPoll = Math.max(mostInPoll, got.count());
                for (ConsumerRecord<String, String> r : got) {
                    int v = Integer.parseInt(r.value());
                    maxDelivery = Math.max(maxDelivery, r.deliveryCount().orElse((short) 0));
                    long now = System.currentTimeMillis();
                    if (now - firstSeen.computeIfAbsent(v, k -> now) < holdMs) {
                        consumer.acknowledge(r, AcknowledgeType.RENEW);
                        renewals++;
                    } else {
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                        accepted.add(v);
                    }
                }
                // Renewing paces the loop: a renewal each few hundred ms.
                if (!got.isEmpty()) Thread.sleep(300);
            }
            consumer.commitSync();
        }
        System.out.println(json(new LinkedHashMap<>(Map.of("accepted", accepted.size(), "renewals", renewals,
            "max_delivery", maxDelivery, "most_in_poll", mostInPoll))));
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
            case "produce" -> produce(args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]));
            case "hold" -> hold(args[1], args[2], args[3]);
            case "renew" -> renew(args[1], args[2], args[3], Integer.parseInt(args[4]), Long.parseLong(args[5]),
                Integer.parseInt(args[6]));
            case "poll" -> poll(args[1], args[2], args[3], args[4], Integer.parseInt(args[5]));
            case "consume" -> consume(args[1], args[2], args[3], args[4], Integer.parseInt(args[5]),
                Integer.parseInt(args[6]), Integer.parseInt(args[7]),
                args.length > 8 ? Integer.parseInt(args[8]) : 0);
            default -> throw new IllegalArgumentException(args[0]);
        }
    }

    static void consume(String bootstrap, String topic, String group, String mode, int consumers,
                        int expected, int timeoutS, int limit) throws Exception {
        boolean explicit = mode.equals("explicit");
        boolean releasing = mode.equals("release");
        ConcurrentHashMap<Integer, AtomicInteger> accepted = new ConcurrentHashMap<>();
        Set<Integer> rejected = ConcurrentHashMap.newKeySet();
        Set<Integer> released = ConcurrentHashMap.newKeySet();
        AtomicInteger maxDelivery = new AtomicInteger();
        AtomicInteger afterDone = new AtomicInteger();
        AtomicBoolean stop = new AtomicBoolean();
        List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
        int[] got = new int[consumers];
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < consumers; i++) {
            final int me = i;
            Thread t = new Thread(() -> {
                try (KafkaShareConsumer<String, String> c = consumer(bootstrap, group, mode)) {
                    c.subscribe(List.of(topic));
                    while (!stop.get()) {
                        ConsumerRecords<String, String> records = c.poll(Duration.ofMillis(200));
                        for (ConsumerRecord<String, String> r : records) {
                            got[me]++;
                            int v = Integer.parseInt(r.value());
                            int delivery = r.deliveryCount().map(Short::intValue).orElse(0);
                            maxDelivery.accumulateAndGet(delivery, Math::max);
                            if (rejected.contains(v) || (accepted.containsKey(v))) afterDone.incrementAndGet();
                            if (releasing) {
                                c.acknowledge(r, AcknowledgeType.RELEASE);
                                if (delivery >= limit) rejected.add(v);
                                continue;
                            }
                            if (!explicit) {
                                accepted.computeIfAbsent(v, k -> new AtomicInteger()).incrementAndGet();
                                continue;
                            }
                            if (v % 10 == 0) {
                                c.acknowledge(r, AcknowledgeType.REJECT);
                                rejected.add(v);
                            } else if (v % 7 == 0 && released.add(v)) {
                                c.acknowledge(r, AcknowledgeType.RELEASE);
                            } else {
                                c.acknowledge(r, AcknowledgeType.ACCEPT);
                                accepted.computeIfAbsent(v, k -> new AtomicInteger()).incrementAndGet();
                            }
                        }
                        if (!records.isEmpty()) c.commitSync();
                    }
                } catch (Throwable e) {
                    errors.add(e);
                }
            });
            t.start();
            threads.add(t);
        }
        awaitAssigned(bootstrap, group, consumers);
        System.out.println("READY");
        System.out.flush();
        long deadline = System.currentTimeMillis() + timeoutS * 1000L;
        while (accepted.size() + rejected.size() < expected && System.currentTimeMillis() < deadline && errors.isEmpty()) {
            Thread.sleep(50);
        }
        long doneAt = System.currentTimeMillis();
        // A little longer: anything delivered again now would be a duplicate.
        Thread.sleep(1500);
        stop.set(true);
        for (Thread t : threads) t.join(30_000);
        for (Throwable e : errors) e.printStackTrace();
        long twice = accepted.values().stream().filter(n -> n.get() > 1).count();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("accepted", accepted.size());
        out.put("accepted_twice", twice);
        out.put("rejected", rejected.size());
        out.put("released", released.size());
        out.put("max_delivery_count", maxDelivery.get());
        out.put("delivered_after_done", afterDone.get());
        out.put("per_consumer", Arrays.toString(got));
        out.put("values", new TreeSet<>(accepted.keySet()).toString());
        out.put("rejected_values", new TreeSet<>(rejected).toString());
        out.put("errors", errors.size());
        out.put("complete", accepted.size() + rejected.size() >= expected);
        System.out.println(json(out));
        System.exit(errors.isEmpty() ? 0 : 1);
    }
}
