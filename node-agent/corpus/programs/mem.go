// Go memory behaviours for the leak corpus (node-agent/corpus/README.md).
//
//	go build -o mem mem.go && ./mem MODE key=value...
//
// Sizes take k/m/g (10^3) or Ki/Mi/Gi (2^10) suffixes; times are seconds.
package main

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

var args = map[string]string{}

func get(k, d string) string {
	if v, ok := args[k]; ok {
		return v
	}
	return d
}

func size(v string) float64 {
	for _, s := range []struct {
		suf string
		mul float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}} {
		if strings.HasSuffix(v, s.suf) {
			f, _ := strconv.ParseFloat(strings.TrimSuffix(v, s.suf), 64)
			return f * s.mul
		}
	}
	f, _ := strconv.ParseFloat(v, 64)
	return f
}

func secs(k, d string) float64 { f, _ := strconv.ParseFloat(get(k, d), 64); return f }

// block is 16 KiB with every page written.
func block(i int) []byte {
	b := make([]byte, 16384)
	for p := 0; p < len(b); p += 4096 {
		b[p] = byte(i)
	}
	return b
}

var sink int

// churn allocates short-lived garbage: what drives the GOGC cycle.
func churn(bytes float64) {
	for i := 0; i < int(bytes/1024); i++ {
		g := make([]byte, 1024)
		g[0] = byte(i)
		sink += int(g[0])
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mem leak|steady|burst key=value...")
		os.Exit(64)
	}
	for _, kv := range os.Args[2:] {
		p := strings.SplitN(kv, "=", 2)
		args[p[0]] = p[1]
	}
	garbage := size(get("churn", "4m"))
	var held [][]byte
	t0 := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	switch os.Args[1] {
	case "leak":
		// Blocks appended to a global slice forever at `rate` bytes/s after `delay` s.
		rate, delay := size(get("rate", "1m")), secs("delay", "0")
		for range tick.C {
			t := time.Since(t0).Seconds() - delay
			for t > 0 && float64(len(held))*16384 < rate*t {
				held = append(held, block(len(held)))
			}
			churn(garbage / 10)
		}
	case "steady":
		// A live set and request garbage: the GOGC sawtooth and the scavenger, no leak.
		for float64(len(held))*16384 < size(get("live", "50m")) {
			held = append(held, block(len(held)))
		}
		for range tick.C {
			churn(garbage / 10)
		}
	case "burst":
		// `size` allocated every `period` s and dropped after `hold` s: the scavenger
		// gives it back to the kernel slowly (a job that processes a big batch now and then).
		n, period, hold := size(get("size", "200Mi")), secs("period", "150"), secs("hold", "20")
		for range tick.C {
			t := math.Mod(time.Since(t0).Seconds(), period)
			if t < hold {
				for float64(len(held))*16384 < n {
					held = append(held, block(len(held)))
				}
			} else {
				held = nil
			}
			churn(garbage / 10)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(64)
	}
}
