// Prints every broker config Apache Kafka defines, as Kafka's own broker
// config documentation lists them (kafka.server.KafkaConfig.main: the
// broker's ConfigDef plus the dynamic-only broker quota configs), one per
// line: name, type, update mode (read-only, per-broker, cluster-wide) and
// default ("\N": none), tab-separated, sorted by name.
//
// Run by bench/kafka/broker_configs.sh, which writes
// crates/keel-broker/src/kafka_broker_configs.tsv.
import java.util.Map;
import java.util.TreeMap;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.server.config.AbstractKafkaConfig;
import org.apache.kafka.server.config.DynamicBrokerConfig;
import org.apache.kafka.server.config.QuotaConfig;

public class BrokerConfigNames {
    public static void main(String[] args) {
        Map<String, String> modes = DynamicBrokerConfig.dynamicConfigUpdateModes();
        Map<String, ConfigDef.ConfigKey> keys = new TreeMap<>(AbstractKafkaConfig.CONFIG_DEF.configKeys());
        // Dynamic only: no static value, settable for a broker or the
        // cluster default.
        QuotaConfig.brokerQuotaConfigs().configKeys().forEach(keys::put);
        Map<String, ConfigDef.ConfigKey> quotas = QuotaConfig.brokerQuotaConfigs().configKeys();
        keys.forEach((name, key) -> {
            String mode = quotas.containsKey(name) ? "cluster-wide" : modes.getOrDefault(name, "read-only");
            String dflt = key.hasDefault() && key.defaultValue != null
                ? ConfigDef.convertToString(key.defaultValue, key.type)
                : "\\N";
            System.out.println(name + "\t" + key.type.name() + "\t" + mode + "\t" + escape(dflt));
        });
    }

    private static String escape(String s) {
        return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\\\\N", "\\N");
    }
}
