package main

// The backfill consumer: reads every partition from its earliest offset up
// to fixed end offsets, as fast as the broker serves (or paced by the
// client). It runs either inside the catch-up process, beside the live
// producer and the tailing consumer, or as a process of its own
// (`keel-bench backfill`, started by `catchup --backfill-process`), so its
// CPU can be told apart from theirs and deprioritised with nice(1),
// SCHED_IDLE (chrt(1)) or pinned with taskset(1). Both ways run the same
// loop with the same client options, against any broker.
//
// The child reports on stdout, one line per poll and one at the end:
//
//	bytes <n>          record bytes (key + value) received in one poll
//	done <json>        the backfillResult
//
// and exits 0; anything else it prints goes to stderr.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

type backfillResult struct {
	Records       int64   `json:"records"`
	Bytes         int64   `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	TargetRecords int64   `json:"target_records"`
	Complete      bool    `json:"complete"`
	// CPUSeconds: user+system CPU of the backfill process (only with
	// --backfill-process; in-process it is part of the bench's CPU).
	CPUSeconds *float64 `json:"cpu_s,omitempty"`
	// Readers: with --backfill-at, each reader's own (Records, Bytes,
	// TargetRecords and Complete above are their sums, Seconds the
	// longest).
	Readers []readerResult `json:"readers,omitempty"`
}

// readerResult: one of several staggered backfill readers.
type readerResult struct {
	// At: where in each partition's history it started (0 = the start,
	// 0.5 = half way).
	At       float64 `json:"at"`
	ClientID string  `json:"client_id"`
	backfillResult
}

// backfillOpts: the knobs of one backfill, shared by both ways of running it.
type backfillOpts struct {
	Bootstrap string
	Topic     string
	MaxS      float64
	MBPerS    float64
	// PartitionFetchBytes: fetch.max.partition.bytes (franz-go
	// FetchMaxPartitionBytes); fetch.max.bytes is four times it.
	PartitionFetchBytes int32
	// ReceiveBuffer: SO_RCVBUF of the consumer's connections (the Java
	// consumer's receive.buffer.bytes); -1 leaves the OS default.
	ReceiveBuffer int
	// At: where in each partition's history the reader starts, as a
	// share of its end offset (0: the earliest offset).
	At float64
	// ClientID: the reader's client.id ("" keeps franz-go's default).
	ClientID string
}

// backfillLoop reads every partition of `target` from its earliest offset
// to target[p] (exclusive), calling onBytes after each poll.
func backfillLoop(ctx context.Context, o backfillOpts, target map[int32]int64, onBytes func(int64)) (backfillResult, error) {
	parts := map[int32]kgo.Offset{}
	remaining := map[int32]bool{}
	var res backfillResult
	for p, off := range target {
		parts[p] = kgo.NewOffset().AtStart()
		from := int64(o.At * float64(off))
		if from > 0 {
			parts[p] = kgo.NewOffset().At(from)
		}
		if off > from {
			remaining[p] = true
		}
		res.TargetRecords += off - from
	}
	opts := []kgo.Opt{kgo.SeedBrokers(o.Bootstrap),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{o.Topic: parts}),
		kgo.FetchMaxBytes(4 * o.PartitionFetchBytes), kgo.FetchMaxPartitionBytes(o.PartitionFetchBytes),
		kgo.FetchMaxWait(500 * time.Millisecond), kgo.Dialer(receiveBufferDialer(o.ReceiveBuffer))}
	if o.ClientID != "" {
		opts = append(opts, kgo.ClientID(o.ClientID))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return res, fmt.Errorf("backfill consumer: %w", err)
	}
	defer cl.Close()
	start := time.Now()
	bctx, cancel := context.WithTimeout(ctx, secs(o.MaxS))
	defer cancel()
	for len(remaining) > 0 && bctx.Err() == nil {
		fs := cl.PollFetches(bctx)
		var bytes int64
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, rec := range p.Records {
				if rec.Offset < target[p.Partition] {
					bytes += int64(len(rec.Key) + len(rec.Value))
					res.Records++
				}
			}
			if n := len(p.Records); n > 0 && p.Records[n-1].Offset+1 >= target[p.Partition] {
				delete(remaining, p.Partition)
			}
		})
		res.Bytes += bytes
		onBytes(bytes)
		if o.MBPerS > 0 {
			// Client-side pacing: sleep until the bytes so far fit the rate.
			sleepCtx(bctx, secs(float64(res.Bytes)/1e6/o.MBPerS)-time.Since(start))
		}
	}
	res.Seconds = time.Since(start).Seconds()
	res.Complete = len(remaining) == 0
	return res, nil
}

// backfill runs the backfill of the catch-up scenario the configured way.
func (r *run) backfill(ctx context.Context, target map[int32]int64) (backfillResult, error) {
	o := backfillOpts{r.cfg.Bootstrap, r.cfg.Topic, r.cfg.BackfillMaxS, r.cfg.BackfillMBPerS,
		r.cfg.BackfillFetchBytes, r.cfg.BackfillReceiveBuffer, 0, ""}
	onBytes := func(b int64) {
		r.backfillBytes.Add(b)
		r.backfillB.add(r.since(), b)
	}
	if len(r.cfg.BackfillAt) > 1 || (len(r.cfg.BackfillAt) == 1 && r.cfg.BackfillAt[0] > 0) {
		return staggered(ctx, o, r.cfg.BackfillAt, target, onBytes)
	}
	if !r.cfg.BackfillProcess {
		return backfillLoop(ctx, o, target, onBytes)
	}
	return runBackfillChild(ctx, r.cfg, target, onBytes)
}

// staggered runs one backfill reader per share in `at` at once, each from
// that share of every partition's history to its end, with a client id of
// its own (as several consumer groups of one application would be): the
// catch-up scenario with many lagging readers.
func staggered(ctx context.Context, o backfillOpts, at []float64, target map[int32]int64,
	onBytes func(int64)) (backfillResult, error) {
	results := make([]readerResult, len(at))
	errs := make([]error, len(at))
	var wg sync.WaitGroup
	var mu sync.Mutex
	shared := func(b int64) {
		mu.Lock()
		defer mu.Unlock()
		onBytes(b)
	}
	for i, share := range at {
		wg.Add(1)
		go func(i int, share float64) {
			defer wg.Done()
			ro := o
			ro.At, ro.ClientID = share, fmt.Sprintf("keel-bench-backfill-%d", i)
			res, err := backfillLoop(ctx, ro, target, shared)
			results[i], errs[i] = readerResult{At: share, ClientID: ro.ClientID, backfillResult: res}, err
		}(i, share)
	}
	wg.Wait()
	total := backfillResult{Complete: true, Readers: results}
	for i, r := range results {
		if errs[i] != nil {
			return total, errs[i]
		}
		total.Records += r.Records
		total.Bytes += r.Bytes
		total.TargetRecords += r.TargetRecords
		total.Seconds = math.Max(total.Seconds, r.Seconds)
		total.Complete = total.Complete && r.Complete
	}
	return total, nil
}

// backfillCommand: the child's argv, wrapped in taskset, chrt and nice as
// configured. The wrappers exec the next program, so the child's PID is
// keel-bench's and all its threads inherit the settings.
func backfillCommand(cfg config, target map[int32]int64) ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var argv []string
	if cfg.BackfillCPUs != "" {
		argv = append(argv, "taskset", "-c", cfg.BackfillCPUs)
	}
	if cfg.BackfillSchedIdle {
		argv = append(argv, "chrt", "--idle", "0")
	}
	if cfg.BackfillNice != 0 {
		argv = append(argv, "nice", "-n", strconv.Itoa(cfg.BackfillNice))
	}
	return append(argv, self, "backfill", "--bootstrap", cfg.Bootstrap, "--topic", cfg.Topic,
		"--target", formatTarget(target), "--max-s", fmt.Sprint(cfg.BackfillMaxS),
		"--max-mb-per-s", fmt.Sprint(cfg.BackfillMBPerS),
		"--partition-fetch-bytes", fmt.Sprint(cfg.BackfillFetchBytes),
		"--receive-buffer-bytes", fmt.Sprint(cfg.BackfillReceiveBuffer)), nil
}

func runBackfillChild(ctx context.Context, cfg config, target map[int32]int64, onBytes func(int64)) (backfillResult, error) {
	argv, err := backfillCommand(cfg, target)
	if err != nil {
		return backfillResult{}, err
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return backfillResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return backfillResult{}, fmt.Errorf("start backfill process %v: %w", argv, err)
	}
	res, perr := readBackfillReport(out, onBytes)
	if err := cmd.Wait(); err != nil {
		return backfillResult{}, fmt.Errorf("backfill process: %w", err)
	}
	if perr != nil {
		return backfillResult{}, perr
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu := float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
		res.CPUSeconds = &cpu
	}
	return res, nil
}

func readBackfillReport(out io.Reader, onBytes func(int64)) (backfillResult, error) {
	var res backfillResult
	done := false
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		switch kind {
		case "bytes":
			n, err := strconv.ParseInt(rest, 10, 64)
			if err != nil {
				return res, fmt.Errorf("backfill process said %q", sc.Text())
			}
			onBytes(n)
		case "done":
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				return res, fmt.Errorf("backfill process result: %w", err)
			}
			done = true
		}
	}
	if !done {
		return res, errors.New("backfill process ended without a result")
	}
	return res, sc.Err()
}

// formatTarget and parseTarget: "0=1200,1=1180" (partition=end offset).
func formatTarget(target map[int32]int64) string {
	parts := make([]string, 0, len(target))
	for p, o := range target {
		parts = append(parts, fmt.Sprintf("%d=%d", p, o))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func parseTarget(s string) (map[int32]int64, error) {
	out := map[int32]int64{}
	for _, item := range strings.Split(s, ",") {
		p, o, ok := strings.Cut(item, "=")
		pi, err1 := strconv.ParseInt(p, 10, 32)
		oi, err2 := strconv.ParseInt(o, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("not partition=offset: %q", item)
		}
		out[int32(pi)] = oi
	}
	return out, nil
}

// mainBackfill is `keel-bench backfill`, the child side of --backfill-process.
func mainBackfill(ctx context.Context, args []string) error {
	var o backfillOpts
	fs := flag.NewFlagSet("backfill", flag.ExitOnError)
	fs.StringVar(&o.Bootstrap, "bootstrap", "", "broker HOST:PORT (required)")
	fs.StringVar(&o.Topic, "topic", "", "topic to read (required)")
	targetS := fs.String("target", "", "end offsets to read up to: partition=offset,... (required)")
	fs.Float64Var(&o.MaxS, "max-s", 120, "stop after this many seconds if not done")
	fs.Float64Var(&o.MBPerS, "max-mb-per-s", 0, "pace to at most this many MB/s (0: unpaced)")
	fetchBytes := fs.Int("partition-fetch-bytes", 16<<20, "fetch.max.partition.bytes (fetch.max.bytes is 4x)")
	fs.IntVar(&o.ReceiveBuffer, "receive-buffer-bytes", -1, "SO_RCVBUF of the consumer's connections; -1: the OS default")
	_ = fs.Parse(args)
	if o.Bootstrap == "" || o.Topic == "" || *targetS == "" {
		return errors.New("backfill: --bootstrap, --topic and --target are required")
	}
	o.PartitionFetchBytes = int32(*fetchBytes)
	target, err := parseTarget(*targetS)
	if err != nil {
		return fmt.Errorf("--target: %w", err)
	}
	w := bufio.NewWriter(os.Stdout)
	res, err := backfillLoop(ctx, o, target, func(b int64) {
		fmt.Fprintf(w, "bytes %d\n", b)
		_ = w.Flush() // the parent timestamps each poll on arrival
	})
	if err != nil {
		return err
	}
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "done %s\n", data)
	return w.Flush()
}

// receiveBufferDialer dials with SO_RCVBUF set to bytes, as the Java
// consumer does with receive.buffer.bytes (64 KiB by default; -1 leaves the
// kernel's autotuning). A small buffer bounds how much one read() copies.
func receiveBufferDialer(bytes int) func(ctx context.Context, network, host string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	if bytes > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, bytes)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	return d.DialContext
}

// parseReceiveBuffer: "-1" (the OS default) or a positive size in bytes
// with the usual suffixes.
func parseReceiveBuffer(s string) (int, error) {
	if s == "-1" {
		return -1, nil
	}
	n, err := parseBytes(s)
	if err != nil || n < 1 || n > 1<<30 {
		return 0, fmt.Errorf("want -1 or 1 B .. 1 GiB, got %q", s)
	}
	return int(n), nil
}
