// txnsession runs franz-go's GroupTransactSession, a consume-transform-
// produce loop with transactions, while consumers join and leave the group,
// and checks that the output topic holds every input record exactly once.
//
// It creates the input topic and writes it while the members run; the
// output topic is created just before (-output-partitions), or by the
// broker on the first produce (0). Member 0 runs from start to finish;
// member i (i >= 1) joins i*-join-every after the start, leaves -stay
// later and comes back -rejoins times with its transactional id, so the
// group rebalances while transactions are open and between them.
//
// It exits 0 when every input record was committed to the output exactly
// once; 1 on any fatal client error (Begin, End, a fetch error) or a wrong
// output, printing every client's log; 2 on bad flags.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type options struct {
	bootstrap        string
	input            string
	output           string
	group            string
	txnPrefix        string
	records          int
	inputPartitions  int
	outputPartitions int
	members          int
	joinEvery        time.Duration
	stay             time.Duration
	maxPoll          int
	pause            time.Duration
	deadline         time.Duration
	verbose          bool
	debug            bool
	txnTimeout       time.Duration
	abrupt           bool
	rejoins          int
	endTimeout       time.Duration
}

// logs is every client's log, one buffer for all, printed on failure.
type logs struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	level kgo.LogLevel
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) logger(name string) kgo.Logger {
	return kgo.BasicLogger(l, l.level, func() string {
		return time.Now().Format("15:04:05.000 ") + name + " "
	})
}

type run struct {
	opt      options
	logs     *logs
	fatal    chan error
	commits  atomic.Int64
	aborts   atomic.Int64
	produced atomic.Int64
}

func main() {
	var o options
	flag.StringVar(&o.bootstrap, "bootstrap", "127.0.0.1:9092", "broker host:port")
	flag.StringVar(&o.input, "input", "txnsession-in", "input topic (created here)")
	flag.StringVar(&o.output, "output", "txnsession-out", "output topic")
	flag.StringVar(&o.group, "group", "txnsession", "consumer group")
	flag.StringVar(&o.txnPrefix, "txn-prefix", "txnsession", "transactional id prefix (one id per member)")
	flag.IntVar(&o.records, "records", 1500, "input records")
	flag.IntVar(&o.inputPartitions, "input-partitions", 6, "input topic partitions")
	flag.IntVar(&o.outputPartitions, "output-partitions", 0, "create the output topic with this many partitions first (0: the broker creates it on the first produce)")
	flag.IntVar(&o.members, "members", 3, "group members")
	flag.DurationVar(&o.joinEvery, "join-every", 1500*time.Millisecond, "member i joins i times this after the start")
	flag.DurationVar(&o.stay, "stay", 3*time.Second, "how long members other than the first stay")
	flag.IntVar(&o.maxPoll, "max-poll", 25, "records per transaction at most")
	flag.DurationVar(&o.pause, "pause", 30*time.Millisecond, "pause after each transaction")
	flag.DurationVar(&o.deadline, "deadline", 60*time.Second, "give up after this long")
	flag.BoolVar(&o.verbose, "v", false, "print the clients' log on success too")
	flag.DurationVar(&o.txnTimeout, "txn-timeout", 40*time.Second, "transaction timeout")
	flag.DurationVar(&o.endTimeout, "end-timeout", 30*time.Second, "how long a transaction's end (flush, commit) may take")
	flag.IntVar(&o.rejoins, "rejoins", 0, "how many times members other than the first come back")
	flag.BoolVar(&o.abrupt, "leave-abruptly", false, "members leave mid-transaction (their context is cancelled)")
	flag.BoolVar(&o.debug, "debug", false, "log at debug level (every request)")
	flag.Parse()
	if o.members < 1 || o.records < 1 || o.maxPoll < 1 {
		fmt.Fprintln(os.Stderr, "members, records and max-poll must be positive")
		os.Exit(2)
	}
	level := kgo.LogLevelInfo
	if o.debug {
		level = kgo.LogLevelDebug
	}
	r := &run{opt: o, logs: &logs{level: level}, fatal: make(chan error, o.members+2)}
	err := r.main()
	if err != nil || o.verbose {
		r.logs.mu.Lock()
		os.Stderr.Write(r.logs.buf.Bytes())
		r.logs.mu.Unlock()
	}
	fmt.Printf("transactions committed %d, aborted %d; records produced %d\n",
		r.commits.Load(), r.aborts.Load(), r.produced.Load())
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("OK: every input record is in the output exactly once")
}

func (r *run) main() error {
	o := r.opt
	ctx, cancel := context.WithTimeout(context.Background(), o.deadline)
	defer cancel()
	admin, err := kgo.NewClient(kgo.SeedBrokers(o.bootstrap), kgo.WithLogger(r.logs.logger("admin")))
	if err != nil {
		return err
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	if err := createTopic(ctx, adm, o.input, o.inputPartitions); err != nil {
		return err
	}
	if o.outputPartitions > 0 {
		if err := createTopic(ctx, adm, o.output, o.outputPartitions); err != nil {
			return err
		}
	}
	fed := make(chan error, 1)
	go func() { fed <- r.feed(ctx, admin) }()

	quit := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for i := range o.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.schedule(ctx, i, start, quit)
		}()
	}
	stopAll := func() {
		close(quit)
		wg.Wait()
	}

	// The run ends when the schedule is over, the input is all written
	// and the group has committed the end of every input partition.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-r.fatal:
			stopAll()
			return err
		case <-ctx.Done():
			stopAll()
			return fmt.Errorf("not done after %s (committed %d transactions)", o.deadline, r.commits.Load())
		case <-tick.C:
		}
		if time.Since(start) < r.span() {
			continue
		}
		if fed != nil {
			select {
			case err := <-fed:
				if err != nil {
					stopAll()
					return fmt.Errorf("feeding the input: %w", err)
				}
				fed = nil
			default:
				continue
			}
		}
		done, err := r.allCommitted(ctx, adm)
		if err != nil {
			stopAll()
			return err
		}
		if done {
			break
		}
	}
	stopAll()
	select {
	case err := <-r.fatal:
		return err
	default:
	}
	return r.verify(ctx)
}

func createTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int) error {
	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err != nil {
		return fmt.Errorf("create %s: %w", topic, err)
	}
	return resp.Err
}

// feed writes the input, values 0..records-1 keyed so every partition
// gets some, in even steps over the time members join and leave, so that
// transactions run through every rebalance.
func (r *run) feed(ctx context.Context, cl *kgo.Client) error {
	o := r.opt
	span := r.span()
	const step = 50 * time.Millisecond
	steps := max(1, int(span/step))
	next := 0
	for s := 1; s <= steps; s++ {
		end := o.records * s / steps
		rs := make([]*kgo.Record, 0, end-next)
		for ; next < end; next++ {
			v := []byte(strconv.Itoa(next))
			rs = append(rs, &kgo.Record{Topic: o.input, Key: v, Value: v})
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			return err
		}
		time.Sleep(step)
	}
	return nil
}

// span is how long members come and go: member i (i >= 1) joins i
// times -join-every after the start, stays -stay, and comes back (with
// its transactional id) -join-every after it left, -rejoins times.
func (r *run) span() time.Duration {
	o := r.opt
	return time.Duration(o.members-1)*o.joinEvery + o.stay +
		time.Duration(o.rejoins)*(o.joinEvery+o.stay)
}

// schedule runs member i as span describes; member 0 runs until quit.
func (r *run) schedule(ctx context.Context, i int, start time.Time, quit chan struct{}) {
	o := r.opt
	at := time.Duration(i) * o.joinEvery
	for round := 0; ; round++ {
		select {
		case <-time.After(time.Until(start.Add(at))):
		case <-quit:
			return
		}
		stop := make(chan struct{})
		go func() {
			var leave <-chan time.Time
			if i > 0 {
				leave = time.After(o.stay)
			}
			select {
			case <-leave:
			case <-quit:
			}
			close(stop)
		}()
		if err := r.member(ctx, i, stop); err != nil {
			r.fatal <- fmt.Errorf("member %d: %w", i, err)
			return
		}
		if i == 0 || round >= o.rejoins {
			return
		}
		at += o.stay + o.joinEvery
	}
}

// member is one GroupTransactSession until stop: poll, produce each record
// to the output, commit.
func (r *run) member(parent context.Context, i int, stop chan struct{}) error {
	o := r.opt
	name := fmt.Sprintf("m%d", i)
	// Leaving cancels whatever the member is doing, an open transaction
	// included (-leave-abruptly), as a process that is stopped does.
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	if o.abrupt {
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(o.bootstrap),
		kgo.TransactionalID(fmt.Sprintf("%s-%d", o.txnPrefix, i)),
		kgo.ConsumerGroup(o.group),
		kgo.ConsumeTopics(o.input),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.AllowAutoTopicCreation(),
		kgo.SessionTimeout(6*time.Second),
		kgo.HeartbeatInterval(300*time.Millisecond),
		kgo.TransactionTimeout(o.txnTimeout),
		kgo.WithLogger(r.logs.logger(name)),
	)
	if err != nil {
		return err
	}
	defer sess.Close()
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		default:
		}
		pollCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		fetches := sess.PollRecords(pollCtx, o.maxPoll)
		cancel()
		for _, fe := range fetches.Errors() {
			if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
				continue
			}
			return fmt.Errorf("fetch %s[%d]: %w", fe.Topic, fe.Partition, fe.Err)
		}
		if fetches.NumRecords() == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		fetches.EachRecord(func(in *kgo.Record) {
			out := &kgo.Record{Topic: o.output, Key: in.Key, Value: in.Value}
			sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
				if err == nil {
					r.produced.Add(1)
				}
			})
		})
		endCtx, cancel := context.WithTimeout(ctx, o.endTimeout)
		committed, err := sess.End(endCtx, kgo.TryCommit)
		cancel()
		if err != nil && ctx.Err() != nil {
			return nil // left mid-transaction
		}
		if err != nil {
			return fmt.Errorf("end: %w", err)
		}
		if committed {
			r.commits.Add(1)
		} else {
			r.aborts.Add(1)
		}
		time.Sleep(o.pause)
	}
}

// allCommitted says whether the group's committed offsets reach the end of
// every input partition.
func (r *run) allCommitted(ctx context.Context, adm *kadm.Client) (bool, error) {
	ends, err := adm.ListEndOffsets(ctx, r.opt.input)
	if err != nil {
		return false, err
	}
	committed, err := adm.FetchOffsets(ctx, r.opt.group)
	if err != nil {
		return false, err
	}
	done := true
	ends.Each(func(e kadm.ListedOffset) {
		c, ok := committed.Lookup(e.Topic, e.Partition)
		if !ok || c.At < e.Offset {
			done = false
		}
	})
	return done, nil
}

// verify reads the output read_committed: every input value exactly once.
func (r *run) verify(ctx context.Context) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(r.opt.bootstrap),
		kgo.ConsumeTopics(r.opt.output),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.WithLogger(r.logs.logger("verify")),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	seen := make(map[int]int, r.opt.records)
	total := 0
	for total < r.opt.records {
		pollCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		fetches := cl.PollFetches(pollCtx)
		cancel()
		if fetches.NumRecords() == 0 {
			if err := fetches.Err0(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("verify: %w", err)
			}
			break
		}
		fetches.EachRecord(func(rec *kgo.Record) {
			v, err := strconv.Atoi(string(rec.Value))
			if err == nil {
				seen[v]++
			}
			total++
		})
	}
	var missing, dups int
	for i := range r.opt.records {
		switch n := seen[i]; {
		case n == 0:
			missing++
		case n > 1:
			dups += n - 1
		}
	}
	if missing > 0 || dups > 0 || total != r.opt.records {
		return fmt.Errorf("output has %d committed records for %d inputs: %d missing, %d duplicated",
			total, r.opt.records, missing, dups)
	}
	return nil
}
