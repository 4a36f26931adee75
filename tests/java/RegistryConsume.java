// A registry-aware Java consumer as the reference for runstate's Schema Registry framing
// (tests/schemas/test_schema_registry.py): Kafka's Java client with Apicurio Registry's Avro
// deserializer in its Confluent-compatible mode (the 00 + 4-byte id framing, the id read
// as the registry's content id, as its Confluent-compatible API gives them out).
//
//   java -cp ... RegistryConsume.java BOOTSTRAP TOPIC REGISTRY_V2_URL COUNT
//
// Reads COUNT records from the start of TOPIC and prints, for each, the full name of the
// schema it was written with and one field: run_id (patches, decisions, sealed records)
// or the body's length (checkpoint records).
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.UUID;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

public class RegistryConsume {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", "java-registry-" + UUID.randomUUID());
        props.put("auto.offset.reset", "earliest");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", "io.apicurio.registry.serde.avro.AvroKafkaDeserializer");
        props.put("apicurio.registry.url", args[2]);
        props.put("apicurio.registry.as-confluent", "true");
        props.put("apicurio.registry.use-id", "contentId");
        int count = Integer.parseInt(args[3]);
        int seen = 0;
        long deadline = System.currentTimeMillis() + 60_000;
        try (KafkaConsumer<String, GenericRecord> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(args[1]));
            while (seen < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, GenericRecord> r : consumer.poll(Duration.ofMillis(500))) {
                    GenericRecord v = r.value();
                    String name = v.getSchema().getFullName();
                    Object field = v.hasField("run_id") ? v.get("run_id")
                        : v.hasField("body") ? ((ByteBuffer) v.get("body")).remaining() : "?";
                    System.out.println(r.key() + " " + name + " " + field);
                    seen++;
                }
            }
        }
        if (seen < count) {
            System.err.println("read " + seen + " of " + count + " records");
            System.exit(1);
        }
    }
}
