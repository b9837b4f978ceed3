package main

// The catch-up scenario. Timeline (t=0 when the live producer starts):
//
//	preload   history written as fast as the broker takes it (not measured)
//	baseline  [0, backfill start): live producer + tailing consumer
//	backfill  [backfill start, backfill end): plus a consumer reading the
//	          topic from the earliest offset to the end offsets at its start
//	after     [backfill end, stop): live producer + tailing consumer again
//
// Produce latency is measured from the record's scheduled send time, not
// from when the Produce call happened, so a producer that falls behind its
// schedule shows up as latency instead of silently sending less
// (coordinated omission). The scheduled time is also what the record value
// carries, so tail end-to-end latency starts from the same instant.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// run holds the live state of one catch-up run.
type run struct {
	cfg config
	t0  time.Time // start of the live phases; monotonic

	produceLatUs series // at = scheduled send time
	tailLatUs    series // at = receive time
	tailLag      series // records behind the high watermark, summed over partitions
	backfillB    series // bytes received by the backfill consumer per poll
	// Per sampling interval (about 1 s, at = its end), in microseconds:
	// run-queue wait summed over the broker's threads and over this
	// process's, and the CPU time of the broker's busiest thread.
	brokerRunqUs, benchRunqUs, brokerBusiestUs series
	brokerS                                    []timedBroker
	brokerMu                                   sync.Mutex

	phase                        atomic.Value // string
	produced, acked, produceErrs atomic.Int64
	tailRecords, lagNow          atomic.Int64
	backfillBytes, backfillRecs  atomic.Int64
	firstProduceErr              atomic.Value // error
}

type timedBroker struct {
	at time.Duration
	s  brokerSample
}

func (r *run) since() time.Duration { return time.Since(r.t0) }

func runCatchup(ctx context.Context, cfg config) (*result, error) {
	r := &run{cfg: cfg}
	r.phase.Store("preload")
	adm, err := kgo.NewClient(kgo.SeedBrokers(cfg.Bootstrap))
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	admin := kadm.NewClient(adm)
	if err := createTopic(ctx, admin, cfg); err != nil {
		return nil, err
	}
	pre, err := r.preload(ctx)
	if err != nil {
		return nil, err
	}
	historyEnd, err := endOffsets(ctx, admin, cfg.Topic)
	if err != nil {
		return nil, err
	}
	if cfg.PauseAfterPreload {
		if err := waitForGo(ctx); err != nil {
			return nil, err
		}
	}

	probe := brokerProbe{pid: cfg.BrokerPID, cgroup: cfg.Cgroup, device: cfg.Device}
	live, cancelLive := context.WithCancel(ctx)
	defer cancelLive()
	r.t0 = time.Now()
	r.enter("baseline")
	var wg sync.WaitGroup
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	wg.Add(3)
	go func() { defer wg.Done(); r.sampleBroker(live, probe) }()
	go func() { defer wg.Done(); r.progress(live) }()
	go func() { defer wg.Done(); r.tail(tailCtx, historyEnd) }()
	prodDone := make(chan error, 1)
	go func() { prodDone <- r.produceLive(live) }()

	marks := []timedBroker{{0, probe.sample()}}
	keelMarks := []keelMark{readKeel(cfg)}
	sleepCtx(ctx, secs(cfg.BaselineS))
	bfStart := r.since()
	marks = append(marks, timedBroker{bfStart, probe.sample()})
	keelMarks = append(keelMarks, readKeel(cfg))
	r.enter("backfill")
	bfTarget, err := endOffsets(ctx, admin, cfg.Topic)
	if err != nil {
		return nil, err
	}
	bf, err := r.backfill(ctx, bfTarget)
	if err != nil {
		return nil, err
	}
	sleepCtx(ctx, secs(cfg.BackfillMinS)-(r.since()-bfStart))
	bfEnd := r.since()
	marks = append(marks, timedBroker{bfEnd, probe.sample()})
	keelMarks = append(keelMarks, readKeel(cfg))
	r.enter("after")
	sleepCtx(ctx, secs(cfg.AfterS))
	cancelLive()
	if err := <-prodDone; err != nil {
		return nil, err
	}
	stop := r.since()
	marks = append(marks, timedBroker{stop, probe.sample()})
	keelMarks = append(keelMarks, readKeel(cfg))
	r.drainTail(ctx, 5*time.Second)
	stopTail()
	wg.Wait()
	if ctx.Err() != nil {
		return nil, errors.New("interrupted")
	}
	return r.result(pre, bf, marks, keelMarks, probe), nil
}

// enter starts a phase and says so on stderr ("keel-bench: phase NAME"),
// the line a caller that traces the machine per phase waits for.
func (r *run) enter(phase string) {
	r.phase.Store(phase)
	fmt.Fprintln(os.Stderr, "keel-bench: phase", phase)
}

// waitForGo: --pause-after-preload. The line on stderr is what the caller
// waits for; one line on stdin lets the live phases start. Stdin closing
// first means the caller is gone, so the run stops.
func waitForGo(ctx context.Context) error {
	fmt.Fprintln(os.Stderr, "keel-bench: preload done; waiting for a line on stdin")
	line := make(chan error, 1)
	go func() {
		_, err := bufio.NewReader(os.Stdin).ReadString('\n')
		line <- err
	}()
	select {
	case <-ctx.Done():
		return errors.New("interrupted")
	case err := <-line:
		if err != nil {
			return fmt.Errorf("--pause-after-preload: stdin: %w", err)
		}
		return nil
	}
}

func createTopic(ctx context.Context, admin *kadm.Client, cfg config) error {
	var configs map[string]*string
	for k, v := range cfg.TopicConfigs {
		if configs == nil {
			configs = map[string]*string{}
		}
		configs[k] = kadm.StringPtr(v)
	}
	resp, err := admin.CreateTopics(ctx, int32(cfg.Partitions), 1, configs, cfg.Topic)
	if err != nil {
		return fmt.Errorf("create topic %s: %w", cfg.Topic, err)
	}
	for _, t := range resp {
		if t.Err != nil {
			return fmt.Errorf("create topic %s: %w", t.Topic, t.Err)
		}
	}
	return nil
}

func endOffsets(ctx context.Context, admin *kadm.Client, topic string) (map[int32]int64, error) {
	offs, err := admin.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	out := map[int32]int64{}
	var perr error
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			perr = o.Err
		}
		out[o.Partition] = o.Offset
	})
	if perr != nil {
		return nil, fmt.Errorf("list end offsets: %w", perr)
	}
	return out, nil
}

// producerOpts: acks=all, no compression, so every broker stores and
// serves the same bytes.
func producerOpts(cfg config, extra ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Bootstrap),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.DefaultProduceTopic(cfg.Topic),
	}, extra...)
}

// value fills a record value: 8 bytes of scheduled send time (Unix ns),
// then incompressible filler.
func value(size int, sentUnixNs int64, filler []byte) []byte {
	v := make([]byte, size)
	binary.BigEndian.PutUint64(v, uint64(sentUnixNs))
	copy(v[8:], filler)
	return v
}

func key(i int64, keys int) []byte { return []byte(fmt.Sprintf("key-%d", i%int64(keys))) }

type preloadResult struct {
	Records int64   `json:"records"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

func (r *run) preload(ctx context.Context) (preloadResult, error) {
	cfg := r.cfg
	cl, err := kgo.NewClient(producerOpts(cfg, kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(100000))...)
	if err != nil {
		return preloadResult{}, err
	}
	defer cl.Close()
	filler := make([]byte, cfg.RecordSize)
	rand.New(rand.NewSource(1)).Read(filler)
	n := cfg.HistoryBytes / int64(cfg.RecordSize)
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, secs(cfg.PreloadTimeout))
	defer cancel()
	var firstErr atomic.Value
	var done atomic.Int64
	for i := int64(0); i < n && ctx.Err() == nil; i++ {
		rec := &kgo.Record{Key: key(i, cfg.Keys), Value: value(cfg.RecordSize, time.Now().UnixNano(), filler)}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
			if d := done.Add(1); cfg.ProgressS > 0 && d%(n/10+1) == 0 {
				fmt.Fprintf(os.Stderr, "preload: %d/%d records (%.0f s)\n", d, n, time.Since(start).Seconds())
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return preloadResult{}, fmt.Errorf("preload: %w", err)
	}
	if e, ok := firstErr.Load().(error); ok {
		return preloadResult{}, fmt.Errorf("preload: %w", e)
	}
	return preloadResult{n, n * int64(cfg.RecordSize), time.Since(start).Seconds()}, nil
}

// produceLive sends cfg.RateRecords records per second on a fixed schedule
// until ctx ends, then waits for the outstanding acks.
func (r *run) produceLive(ctx context.Context) error {
	cfg := r.cfg
	cl, err := kgo.NewClient(producerOpts(cfg, kgo.ProducerLinger(0))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	filler := make([]byte, cfg.RecordSize)
	rand.New(rand.NewSource(2)).Read(filler)
	interval := time.Second / time.Duration(cfg.RateRecords)
	t0Unix := r.t0.UnixNano()
	for i := int64(0); ; i++ {
		sched := time.Duration(i) * interval
		if d := sched - r.since(); d > 0 {
			if !sleepCtx(ctx, d) {
				break
			}
		}
		if ctx.Err() != nil {
			break
		}
		rec := &kgo.Record{Key: key(i, cfg.Keys), Value: value(cfg.RecordSize, t0Unix+int64(sched), filler)}
		r.produced.Add(1)
		// Not ctx: records already handed over must finish even after stop.
		cl.Produce(context.Background(), rec, func(_ *kgo.Record, err error) {
			if err != nil {
				r.produceErrs.Add(1)
				r.firstProduceErr.CompareAndSwap(nil, err)
				return
			}
			r.acked.Add(1)
			r.produceLatUs.add(sched, (r.since() - sched).Microseconds())
		})
	}
	fctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		return fmt.Errorf("live producer flush: %w", err)
	}
	return nil
}

// tail consumes from the end of the history and records each record's
// end-to-end latency and the partition lag after each poll.
func (r *run) tail(ctx context.Context, from map[int32]int64) {
	parts := map[int32]kgo.Offset{}
	for p, o := range from {
		parts[p] = kgo.NewOffset().At(o)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.cfg.Bootstrap),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.cfg.Topic: parts}),
		kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, "tail consumer:", err)
		return
	}
	defer cl.Close()
	t0Unix := r.t0.UnixNano()
	lagBy := map[int32]int64{}
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		now := r.since()
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if p.Err != nil || len(p.Records) == 0 {
				return
			}
			for _, rec := range p.Records {
				if len(rec.Value) >= 8 {
					sent := int64(binary.BigEndian.Uint64(rec.Value)) - t0Unix
					r.tailLatUs.add(now, (now - time.Duration(sent)).Microseconds())
				}
			}
			r.tailRecords.Add(int64(len(p.Records)))
			last := p.Records[len(p.Records)-1].Offset
			lagBy[p.Partition] = max(p.HighWatermark-(last+1), 0)
		})
		var lag int64
		for _, l := range lagBy {
			lag += l
		}
		r.lagNow.Store(lag)
		r.tailLag.add(now, lag)
	}
}

// drainTail waits until the tail consumer has seen every acked live record.
func (r *run) drainTail(ctx context.Context, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for r.tailRecords.Load() < r.acked.Load() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *run) sampleBroker(ctx context.Context, probe brokerProbe) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var prevBroker, prevBench threadSched
	for {
		s := probe.sample()
		now := r.since()
		r.brokerMu.Lock()
		r.brokerS = append(r.brokerS, timedBroker{now, s})
		r.brokerMu.Unlock()
		bench := readThreadSched("self")
		if prevBench != nil {
			wait, _ := schedDelta(prevBench, bench)
			r.benchRunqUs.add(now, wait)
		}
		prevBench = bench
		if probe.pid > 0 {
			broker := readThreadSched(strconv.Itoa(probe.pid))
			if prevBroker != nil {
				wait, busiest := schedDelta(prevBroker, broker)
				r.brokerRunqUs.add(now, wait)
				r.brokerBusiestUs.add(now, busiest)
			}
			prevBroker = broker
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *run) progress(ctx context.Context) {
	if r.cfg.ProgressS <= 0 {
		return
	}
	t := time.NewTicker(secs(r.cfg.ProgressS))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fmt.Fprintf(os.Stderr, "%-8s t=%5.0fs produced=%d acked=%d errors=%d tail=%d lag=%d backfill=%.1f MB\n",
			r.phase.Load(), r.since().Seconds(), r.produced.Load(), r.acked.Load(), r.produceErrs.Load(),
			r.tailRecords.Load(), r.lagNow.Load(), float64(r.backfillBytes.Load())/1e6)
	}
}

// sleepCtx sleeps d or until ctx ends; it reports whether it slept fully.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
