// JVM memory behaviours for the leak corpus (node-agent/corpus/README.md).
//
//   javac -d OUT Mem.java && java -XX:+UseG1GC -cp OUT Mem MODE key=value...
//
// Sizes take k/m/g (10^3) or Ki/Mi/Gi (2^10) suffixes; times are seconds.
import java.util.*;

public class Mem {
    static Map<String, String> a = new HashMap<>();
    static volatile long sink;

    static long size(String v) {
        String[][] s = {{"Ki", "1024"}, {"Mi", "1048576"}, {"Gi", "1073741824"}, {"k", "1000"}, {"m", "1000000"}, {"g", "1000000000"}};
        for (String[] x : s)
            if (v.endsWith(x[0])) return (long) (Double.parseDouble(v.substring(0, v.length() - x[0].length())) * Long.parseLong(x[1]));
        return (long) Double.parseDouble(v);
    }

    static String get(String k, String d) { return a.getOrDefault(k, d); }

    /** 16 KiB with every page written. */
    static byte[] block(long i) {
        byte[] b = new byte[16384];
        for (int p = 0; p < b.length; p += 4096) b[p] = (byte) i;
        return b;
    }

    /** Short-lived request garbage: what keeps G1's young collections running. */
    static void churn(long bytes) {
        for (long i = 0; i < bytes / 1024; i++) { byte[] g = new byte[1024]; g[0] = (byte) i; sink += g[0]; }
    }

    public static void main(String[] args) throws Exception {
        for (int i = 1; i < args.length; i++) { String[] kv = args[i].split("=", 2); a.put(kv[0], kv[1]); }
        String mode = args.length > 0 ? args[0] : "";
        long garbage = size(get("churn", "4m"));
        List<byte[]> held = new ArrayList<>();
        long t0 = System.nanoTime();
        switch (mode) {
            case "leak": {
                // Blocks kept forever at `rate` bytes/s after `delay` s.
                long rate = size(get("rate", "1m"));
                double delay = Double.parseDouble(get("delay", "0"));
                while (true) {
                    double t = (System.nanoTime() - t0) / 1e9 - delay;
                    while (t > 0 && (long) held.size() * 16384 < rate * t) held.add(block(held.size()));
                    churn(garbage / 10);
                    Thread.sleep(100);
                }
            }
            case "warmup": {
                // A cache filled fast, then slower and slower (95 % of `target` at `secs`): the
                // heap expands as it fills, then only request garbage remains.
                long target = size(get("target", "150m"));
                double secs = Double.parseDouble(get("secs", "120"));
                while (true) {
                    double t = (System.nanoTime() - t0) / 1e9;
                    double want = t >= secs ? target : target * (1 - Math.exp(-3 * t / secs));
                    while ((long) held.size() * 16384 < want) held.add(block(held.size()));
                    churn(garbage / 10);
                    Thread.sleep(100);
                }
            }
            case "steady": {
                // A live set of `live` bytes and request garbage: G1 at work, nothing kept.
                long live = size(get("live", "50m"));
                while ((long) held.size() * 16384 < live) held.add(block(held.size()));
                while (true) { churn(garbage / 10); Thread.sleep(100); }
            }
            default:
                System.err.println("usage: Mem leak|warmup|steady key=value...");
                System.exit(64);
        }
    }
}
