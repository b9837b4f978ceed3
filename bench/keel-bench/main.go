// keel-bench drives any Kafka-compatible broker with franz-go, a third-party
// Go client, so that Keel and Apache Kafka are measured with the same client.
//
// Scenario `catchup`: preload keyed history, run a constant-rate acks=all
// producer and a tailing consumer, then start a backfill consumer from the
// earliest offset and report latencies per phase (baseline, during the
// backfill, after it). It prints numbers and asserts none.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	Bootstrap      string  `json:"bootstrap"`
	Topic          string  `json:"topic"`
	Partitions     int     `json:"partitions"`
	HistoryBytes   int64   `json:"history_bytes"`
	RecordSize     int     `json:"record_size"`
	Keys           int     `json:"keys"`
	RateRecords    int     `json:"rate_records_per_s"`
	BaselineS      float64 `json:"baseline_s"`
	BackfillMaxS   float64 `json:"backfill_max_s"`
	BackfillMinS   float64 `json:"backfill_min_s"`
	BackfillMBPerS float64 `json:"backfill_max_mb_per_s"`
	AfterS         float64 `json:"after_s"`
	BrokerPID      int     `json:"broker_pid"`
	Cgroup         string  `json:"cgroup"`
	Device         string  `json:"device"`
	// Where the backfill consumer runs: in this process (the default) or
	// in a child process, optionally niced, SCHED_IDLE or pinned.
	BackfillProcess   bool   `json:"backfill_process"`
	BackfillNice      int    `json:"backfill_nice"`
	BackfillSchedIdle bool   `json:"backfill_sched_idle"`
	BackfillCPUs      string `json:"backfill_cpus"`
	// The backfill consumer's fetch.max.partition.bytes.
	BackfillFetchBytes int32 `json:"backfill_partition_fetch_bytes"`
	// BackfillReceiveBuffer: the backfill consumer's socket receive buffer
	// (the Java consumer's receive.buffer.bytes); -1 leaves the OS default.
	BackfillReceiveBuffer int `json:"backfill_receive_buffer_bytes"`
	// BackfillAt: one backfill reader per share, each from that share of
	// every partition's history (0: its start), all at once (the
	// in-process consumer only).
	BackfillAt []float64 `json:"backfill_at,omitempty"`
	// Topic configs for CreateTopics (segment.bytes, remote.storage.enable).
	TopicConfigs map[string]string `json:"topic_configs,omitempty"`
	// Wait for a line on stdin between the preload and the live phases, so
	// the caller can let the broker settle (e.g. move the history to a
	// colder tier) first.
	PauseAfterPreload bool `json:"pause_after_preload"`
	// Keel's admin /stats URL: tier counters per phase.
	StatsURL       string  `json:"stats_url,omitempty"`
	MetricsURL     string  `json:"metrics_url,omitempty"`
	JSONPath       string  `json:"-"`
	ProgressS      float64 `json:"-"`
	PreloadTimeout float64 `json:"-"`
}

func usage() {
	fmt.Fprintf(os.Stderr, `usage: keel-bench catchup --bootstrap HOST:PORT [flags]
       keel-bench backfill --bootstrap HOST:PORT --topic T --target P=OFFSET,...

Scenarios:
  catchup   preload history, constant-rate producer + tailing consumer,
            then a backfill consumer from the earliest offset; latencies
            per phase (baseline / backfill / after)
  backfill  the backfill consumer alone, as the child process that
            "catchup --backfill-process" starts; reports on stdout

Run "keel-bench catchup -h" for the flags.
`)
}

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "catchup" && os.Args[1] != "backfill") {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if os.Args[1] == "backfill" {
		if err := mainBackfill(ctx, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "keel-bench:", err)
			os.Exit(1)
		}
		return
	}
	cfg := parseCatchup(os.Args[2:])
	res, err := runCatchup(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "keel-bench:", err)
		os.Exit(1)
	}
	printTable(os.Stdout, res)
	if cfg.JSONPath != "" {
		if err := writeJSON(cfg.JSONPath, res); err != nil {
			fmt.Fprintln(os.Stderr, "keel-bench:", err)
			os.Exit(1)
		}
	}
}

func parseCatchup(args []string) config {
	var c config
	fs := flag.NewFlagSet("catchup", flag.ExitOnError)
	fs.StringVar(&c.Bootstrap, "bootstrap", "", "broker HOST:PORT (required)")
	fs.StringVar(&c.Topic, "topic", "", "topic to create (default catchup-<unix time>); must not exist")
	fs.IntVar(&c.Partitions, "partitions", 1, "partitions of the topic")
	history := fs.String("history-bytes", "256MiB", "bytes of keyed history to preload (suffixes KiB MiB GiB, KB MB GB)")
	fs.IntVar(&c.RecordSize, "record-size", 1024, "bytes per record value (>= 16)")
	fs.IntVar(&c.Keys, "keys", 100000, "size of the key space (keys key-0 .. key-N-1)")
	fs.IntVar(&c.RateRecords, "rate", 1000, "live producer rate, records per second")
	fs.Float64Var(&c.BaselineS, "baseline-s", 20, "seconds of baseline before the backfill starts")
	fs.Float64Var(&c.BackfillMaxS, "backfill-max-s", 120, "stop the backfill after this many seconds if not done")
	fs.Float64Var(&c.BackfillMinS, "backfill-min-s", 0, "keep the backfill phase at least this long (for tiny histories that are read in a blink)")
	fs.Float64Var(&c.BackfillMBPerS, "backfill-max-mb-per-s", 0, "pace the backfill consumer to at most this many MB/s (0: as fast as the broker serves)")
	fetchBytes := fs.String("backfill-partition-fetch-bytes", "16MiB", "backfill consumer's fetch.max.partition.bytes (fetch.max.bytes is 4x)")
	rcvBuf := fs.String("backfill-receive-buffer-bytes", "-1", "backfill consumer's socket receive buffer, SO_RCVBUF (the Java consumer's receive.buffer.bytes, 64KiB there); -1: the OS default")
	fs.Float64Var(&c.AfterS, "after-s", 20, "seconds measured after the backfill ends")
	fs.IntVar(&c.BrokerPID, "broker-pid", 0, "broker PID: report its disk reads (/proc/PID/io) and RSS")
	fs.StringVar(&c.Cgroup, "cgroup", "", "broker's memory cgroup directory: report its page cache (memory.stat)")
	fs.StringVar(&c.Device, "device", "", "MAJ:MIN of the block device holding the broker's data: report its I/O (/sys/dev/block/MAJ:MIN/stat)")
	backfillAt := fs.String("backfill-at", "0", "backfill readers to run at once, each from this share of the history: e.g. 0,0.25,0.5,0.75 (many lagging readers)")
	fs.BoolVar(&c.BackfillProcess, "backfill-process", false, "run the backfill consumer as a child process (keel-bench backfill) instead of in this one")
	fs.IntVar(&c.BackfillNice, "backfill-nice", 0, "run the backfill process under nice -n N (implies --backfill-process)")
	fs.BoolVar(&c.BackfillSchedIdle, "backfill-sched-idle", false, "run the backfill process with SCHED_IDLE, chrt --idle 0 (implies --backfill-process)")
	fs.StringVar(&c.BackfillCPUs, "backfill-cpus", "", "pin the backfill process to these CPUs, taskset -c LIST (implies --backfill-process)")
	c.TopicConfigs = map[string]string{}
	fs.Func("topic-config", "topic config KEY=VALUE for the created topic (repeatable)", func(kv string) error {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", kv)
		}
		c.TopicConfigs[k] = v
		return nil
	})
	fs.BoolVar(&c.PauseAfterPreload, "pause-after-preload", false,
		"after the preload, print \"keel-bench: preload done\" on stderr and wait for a line on stdin before the live phases")
	fs.StringVar(&c.StatsURL, "stats-url", "", "Keel's admin endpoint, http://HOST:PORT/stats: report tier counters per phase")
	fs.StringVar(&c.MetricsURL, "metrics-url", "", "Keel's admin endpoint, http://HOST:PORT/metrics: report request stages per phase")
	fs.StringVar(&c.JSONPath, "json", "", "also write the results as JSON to this file")
	fs.Float64Var(&c.ProgressS, "progress-s", 5, "seconds between progress lines on stderr (0: none)")
	fs.Float64Var(&c.PreloadTimeout, "preload-timeout-s", 1800, "give up if the preload takes longer")
	_ = fs.Parse(args)
	var err error
	if c.HistoryBytes, err = parseBytes(*history); err != nil {
		fatalf("--history-bytes: %v", err)
	}
	fb, err := parseBytes(*fetchBytes)
	if err != nil || fb < 1 || fb > 1<<28 {
		fatalf("--backfill-partition-fetch-bytes: want 1 B .. 256 MiB, got %q", *fetchBytes)
	}
	c.BackfillFetchBytes = int32(fb)
	if c.BackfillReceiveBuffer, err = parseReceiveBuffer(*rcvBuf); err != nil {
		fatalf("--backfill-receive-buffer-bytes: %v", err)
	}
	switch {
	case c.Bootstrap == "":
		fatalf("--bootstrap is required")
	case c.RecordSize < 16:
		fatalf("--record-size must be at least 16 (the value embeds a timestamp)")
	case c.Partitions < 1 || c.Keys < 1 || c.RateRecords < 1:
		fatalf("--partitions, --keys and --rate must be positive")
	}
	if c.BackfillNice != 0 || c.BackfillSchedIdle || c.BackfillCPUs != "" {
		c.BackfillProcess = true
	}
	for _, f := range strings.Split(*backfillAt, ",") {
		share, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || share < 0 || share >= 1 {
			fatalf("--backfill-at: want shares in [0, 1), got %q", f)
		}
		c.BackfillAt = append(c.BackfillAt, share)
	}
	if (len(c.BackfillAt) > 1 || c.BackfillAt[0] > 0) && c.BackfillProcess {
		fatalf("--backfill-at runs its readers in the bench process: not with --backfill-process, -nice, -sched-idle or -cpus")
	}
	if c.Topic == "" {
		c.Topic = fmt.Sprintf("catchup-%d", time.Now().Unix())
	}
	return c
}

// setup says where the backfill consumer ran, for tables and JSON.
func (c config) setup() string {
	fetch := fmt.Sprintf("backfill fetches of %.0f MiB per partition", float64(c.BackfillFetchBytes)/(1<<20))
	if c.BackfillFetchBytes < 1<<20 {
		fetch = fmt.Sprintf("backfill fetches of %d KiB per partition", c.BackfillFetchBytes>>10)
	}
	if c.BackfillReceiveBuffer > 0 {
		fetch += fmt.Sprintf(", receive buffer %d KiB", c.BackfillReceiveBuffer>>10)
	}
	if len(c.BackfillAt) > 1 || c.BackfillAt[0] > 0 {
		at := make([]string, len(c.BackfillAt))
		for i, share := range c.BackfillAt {
			at[i] = fmt.Sprintf("%.0f%%", share*100)
		}
		return fmt.Sprintf("%s, %d consumers in the bench process from %s of the history", fetch,
			len(at), strings.Join(at, ", "))
	}
	if !c.BackfillProcess {
		return fetch + ", consumer in the bench process (beside the live producer and tail)"
	}
	s := fetch + ", consumer in its own process"
	if c.BackfillNice != 0 {
		s += fmt.Sprintf(", nice %d", c.BackfillNice)
	}
	if c.BackfillSchedIdle {
		s += ", SCHED_IDLE"
	}
	if c.BackfillCPUs != "" {
		s += ", CPUs " + c.BackfillCPUs
	}
	return s
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "keel-bench: "+format+"\n", a...)
	os.Exit(2)
}

// parseBytes accepts "1048576", "512MiB", "8GiB", "100MB".
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil || n < 0 {
		return 0, fmt.Errorf("not a byte count: %q", s)
	}
	return n * mult, nil
}
