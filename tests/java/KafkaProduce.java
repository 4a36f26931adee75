// Kafka's own Java producer as the reference for where a run's records land
// (tests/schemas/test_interop_java.py).
//
//   java -cp kafka-clients.jar:... KafkaProduce.java BOOTSTRAP TOPIC < records
//
// Each stdin line is "<hex key> <hex value>"; the producer has Kafka's defaults (the built-in
// partitioner: murmur2 of the key bytes) with acks=all. For each record, in order, it prints
// "<hex key> <partition> <offset>".
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KafkaProduce {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("acks", "all");
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        HexFormat hex = HexFormat.of();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (String line; (line = in.readLine()) != null; ) {
                if (line.isBlank()) continue;
                String[] parts = line.trim().split(" ", -1);
                byte[] key = hex.parseHex(parts[0]);
                RecordMetadata md = producer.send(new ProducerRecord<>(args[1], key, hex.parseHex(parts[1]))).get();
                System.out.println(parts[0] + " " + md.partition() + " " + md.offset());
            }
        }
    }
}
