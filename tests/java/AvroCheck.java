// Apache Avro's Java library as the reference for runstate's log records (tests/schemas/test_interop_java.py).
//
//   java -cp avro.jar:... AvroCheck.java SCHEMA_DIR < records
//
// SCHEMA_DIR holds every published writer schema as <kind>.v<N>.avsc. Each stdin line is
// "<kind> <hex of one single-object encoded record>". For each line it prints one line:
//   OK <writer version> <hex of the same record re-encoded by BinaryMessageEncoder> <record resolved to the newest schema, as JSON>
//   ERR <exception class> <message>
// First it prints, per schema, "SCHEMA <kind> <version> <hex of the header Java writes>".
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Stream;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.avro.message.SchemaStore;

public class AvroCheck {
    public static void main(String[] args) throws Exception {
        Map<String, TreeMap<Integer, Schema>> byKind = new HashMap<>();
        try (Stream<Path> files = Files.list(Paths.get(args[0]))) {
            for (Path p : (Iterable<Path>) files::iterator) {
                String name = p.getFileName().toString();
                if (!name.endsWith(".avsc")) continue;
                String kind = name.substring(0, name.indexOf(".v"));
                int version = Integer.parseInt(name.substring(name.indexOf(".v") + 2, name.length() - 5));
                // One parser per file: every version defines the same names.
                Schema schema = new Schema.Parser().parse(Files.readString(p));
                byKind.computeIfAbsent(kind, k -> new TreeMap<>()).put(version, schema);
            }
        }
        HexFormat hex = HexFormat.of();
        Map<String, BinaryMessageDecoder<GenericRecord>> newest = new HashMap<>();
        for (var kind : byKind.entrySet()) {
            SchemaStore.Cache store = new SchemaStore.Cache();
            for (var v : kind.getValue().entrySet()) {
                store.addSchema(v.getValue());
                long fp = SchemaNormalization.parsingFingerprint64(v.getValue());
                byte[] header = ByteBuffer.allocate(10).order(java.nio.ByteOrder.LITTLE_ENDIAN)
                        .put((byte) 0xC3).put((byte) 0x01).putLong(fp).array();
                System.out.println("SCHEMA " + kind.getKey() + " " + v.getKey() + " " + hex.formatHex(header));
            }
            newest.put(kind.getKey(), new BinaryMessageDecoder<>(GenericData.get(), kind.getValue().lastEntry().getValue(), store));
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null; ) {
            if (line.isBlank()) continue;
            String[] parts = line.trim().split(" ");
            byte[] data = hex.parseHex(parts[1]);
            try {
                GenericRecord resolved = newest.get(parts[0]).decode(data);
                Integer version = null;
                BinaryMessageEncoder<GenericRecord> encoder = null;
                GenericRecord asWritten = null;
                for (var v : byKind.get(parts[0]).entrySet()) {
                    BinaryMessageDecoder<GenericRecord> own = new BinaryMessageDecoder<>(GenericData.get(), v.getValue());
                    try {
                        asWritten = own.decode(data);
                    } catch (org.apache.avro.message.MissingSchemaException e) {
                        continue;
                    }
                    version = v.getKey();
                    encoder = new BinaryMessageEncoder<>(GenericData.get(), v.getValue());
                    break;
                }
                ByteBuffer again = encoder.encode(asWritten);
                byte[] out = new byte[again.remaining()];
                again.get(out);
                System.out.println("OK " + version + " " + hex.formatHex(out) + " " + GenericData.get().toString(resolved));
            } catch (Exception e) {
                System.out.println("ERR " + e.getClass().getName() + " " + String.valueOf(e.getMessage()).replace('\n', ' '));
            }
        }
    }
}
