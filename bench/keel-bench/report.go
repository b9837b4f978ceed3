package main

// Per-phase results, the human table and the JSON file. Byte rates are in
// MB/s (10^6 bytes); memory figures in MiB.

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"time"
)

type latencyJSON struct {
	Count  int64   `json:"count"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
}

type tailJSON struct {
	latencyJSON
	MaxLagRecords int64 `json:"max_lag_records"`
}

// brokerJSON: nil fields were not measured (no PID, no cgroup, unreadable).
type brokerJSON struct {
	DiskReadBytes     *int64 `json:"disk_read_bytes"`
	PageCacheBytesEnd *int64 `json:"page_cache_bytes_end"`
	PageCacheBytesMax *int64 `json:"page_cache_bytes_max"`
	RSSBytesEnd       *int64 `json:"rss_bytes_end"`
	RSSBytesMax       *int64 `json:"rss_bytes_max"`
	// CPU in cores: CPU seconds per second of the phase (2.0 = two cores
	// busy). BenchCPUCores is this process: live producer, tail and, unless
	// the backfill runs in its own process, the backfill consumer.
	CPUCores      *float64 `json:"cpu_cores"`
	BenchCPUCores *float64 `json:"bench_cpu_cores"`
	Device        *devJSON `json:"device,omitempty"`
	// Run-queue wait (runnable, no CPU free), milliseconds per second of
	// the phase, summed over threads; and the busiest broker thread's CPU
	// in cores (mean over 1 s intervals). From /proc/PID/task/*/schedstat.
	Host              *hostJSON `json:"host,omitempty"`
	RunqMsPerS        *float64  `json:"runq_ms_per_s"`
	BenchRunqMsPerS   *float64  `json:"bench_runq_ms_per_s"`
	BusiestThreadCore *float64  `json:"busiest_thread_cores"`
}

// hostJSON: the whole machine's CPU during a phase, in cores (CPU seconds
// per second, summed over CPUs): busy (not idle, not iowait), and parts of it.
type hostJSON struct {
	Cores       int     `json:"cores"`
	BusyCores   float64 `json:"busy_cores"`
	SystemCores float64 `json:"system_cores"`
	IRQCores    float64 `json:"irq_softirq_cores"`
	StealCores  float64 `json:"steal_cores"`
	IOWaitCores float64 `json:"iowait_cores"`
}

// devJSON: the data disk during a phase (every process's I/O on it, not
// only the broker's). Await is the mean time per completed request.
type devJSON struct {
	ReadMB       float64 `json:"read_mb"`
	WriteMB      float64 `json:"write_mb"`
	ReadIOPS     float64 `json:"read_iops"`
	WriteIOPS    float64 `json:"write_iops"`
	ReadAwaitMs  float64 `json:"read_await_ms"`
	WriteAwaitMs float64 `json:"write_await_ms"`
	UtilPct      float64 `json:"util_pct"`
}

type phaseJSON struct {
	Name           string      `json:"name"`
	StartS         float64     `json:"start_s"`
	Seconds        float64     `json:"seconds"`
	Produce        latencyJSON `json:"produce"`
	Tail           tailJSON    `json:"tail"`
	BackfillBytes  int64       `json:"backfill_bytes"`
	BackfillMBPerS float64     `json:"backfill_mb_per_s"`
	// CPU of the backfill process over its own run time, in cores (only
	// with --backfill-process; otherwise it is in the bench's CPU).
	BackfillCPUCores *float64   `json:"backfill_process_cpu_cores,omitempty"`
	Broker           brokerJSON `json:"broker"`
	// Keel's tier counters (--stats-url); nil for other brokers.
	Tiers *tiersPhaseJSON `json:"tiers,omitempty"`
	// Keel's request stages (--metrics-url), by API and stage.
	Stages map[string]map[string]stageJSON `json:"stages,omitempty"`
	// The latencies over the phase's quiet seconds alone (nil when the
	// host's CPU counters were not read).
	Quiet *quietJSON `json:"quiet,omitempty"`
}

// quietStealCores: a second of the run is quiet when the hypervisor took
// less than this much of the machine's CPU (steal, in cores) during it. On
// a shared VM steal comes and goes from minute to minute and moves every
// latency with it; the quiet seconds compare phases without it.
const quietStealCores = 0.05

// quietJSON: a phase's produce and tail latencies over its quiet seconds.
type quietJSON struct {
	Seconds float64     `json:"seconds"`
	Produce latencyJSON `json:"produce"`
	Tail    latencyJSON `json:"tail"`
}

// quietSpans: the intervals between consecutive samples in which steal
// stayed under quietStealCores; nil when the host's CPU was not read.
func quietSpans(periodic []timedBroker) [][2]time.Duration {
	var out [][2]time.Duration
	for i := 1; i < len(periodic); i++ {
		if steal := stealBetween(periodic[i-1], periodic[i]); steal >= 0 && steal < quietStealCores {
			out = append(out, [2]time.Duration{periodic[i-1].at, periodic[i].at})
		}
	}
	return out
}

// quietPhase: the latencies of samples in [from, to) that fall in a quiet
// span; nil when no sample interval was measured. A sample is placed by
// one instant (a produce when sent, a tail record when received), so one
// that straddles a quiet second and a stolen one may count as quiet: the
// quiet p99 is an upper bound on the steal-free one.
func quietPhase(prod, tail []sample, quiet [][2]time.Duration, measured bool, from, to time.Duration) *quietJSON {
	if !measured {
		return nil
	}
	var q quietJSON
	var p, t []int64
	for _, span := range quiet {
		lo, hi := max(span[0], from), min(span[1], to)
		if lo >= hi {
			continue
		}
		q.Seconds += (hi - lo).Seconds()
		p = append(p, between(prod, lo, hi)...)
		t = append(t, between(tail, lo, hi)...)
	}
	q.Produce, q.Tail = lat(summarize(p)), lat(summarize(t))
	return &q
}

type pointJSON struct {
	TS             float64 `json:"t_s"`
	ProduceP99Ms   float64 `json:"produce_p99_ms"`
	ProduceMaxMs   float64 `json:"produce_max_ms"`
	TailP99Ms      float64 `json:"tail_p99_ms"`
	TailMaxMs      float64 `json:"tail_max_ms"`
	TailLagMax     int64   `json:"tail_lag_max_records"`
	BackfillMB     float64 `json:"backfill_mb"`
	PageCacheBytes int64   `json:"page_cache_bytes"`
	RSSBytes       int64   `json:"rss_bytes"`
	BrokerCPUCores float64 `json:"broker_cpu_cores"` // -1: unknown
	BenchCPUCores  float64 `json:"bench_cpu_cores"`
	HostStealCores float64 `json:"host_steal_cores"` // -1: unknown
}

type result struct {
	Scenario      string         `json:"scenario"`
	Client        string         `json:"client"`
	Setup         string         `json:"setup"`
	Config        config         `json:"config"`
	CgroupVersion string         `json:"cgroup_version"`
	Preload       preloadResult  `json:"preload"`
	Backfill      backfillResult `json:"backfill"`
	ProduceErrors int64          `json:"produce_errors"`
	FirstError    string         `json:"first_produce_error,omitempty"`
	Phases        []phaseJSON    `json:"phases"`
	BackfillStart float64        `json:"backfill_start_s"`
	BackfillEnd   float64        `json:"backfill_end_s"`
	Timeline      []pointJSON    `json:"timeline"`
}

func lat(s summary) latencyJSON {
	return latencyJSON{s.Count, usToMs(s.P50), usToMs(s.P99), usToMs(s.P999), usToMs(s.Max)}
}

func (r *run) result(pre preloadResult, bf backfillResult, marks []timedBroker, keelMarks []keelMark,
	probe brokerProbe) *result {
	prod, tail, lag, bfb := r.produceLatUs.snapshot(), r.tailLatUs.snapshot(), r.tailLag.snapshot(), r.backfillB.snapshot()
	brunq, benchq, busiest := r.brokerRunqUs.snapshot(), r.benchRunqUs.snapshot(), r.brokerBusiestUs.snapshot()
	r.brokerMu.Lock()
	periodic := append([]timedBroker(nil), r.brokerS...)
	r.brokerMu.Unlock()
	res := &result{Scenario: "catchup", Client: "franz-go", Setup: r.cfg.setup(), Config: r.cfg, Preload: pre, Backfill: bf,
		ProduceErrors: r.produceErrs.Load(), BackfillStart: marks[1].at.Seconds(), BackfillEnd: marks[2].at.Seconds()}
	if probe.cgroup != "" {
		res.CgroupVersion = cgroupVersion(probe.cgroup)
	}
	if e, ok := r.firstProduceErr.Load().(error); ok {
		res.FirstError = e.Error()
	}
	quiet := quietSpans(periodic)
	measured := len(periodic) > 1 && periodic[0].s.Host.Ok
	names := []string{"baseline", "backfill", "after"}
	for i, name := range names {
		from, to := marks[i].at, marks[i+1].at
		hi := to
		if i == len(names)-1 {
			hi = math.MaxInt64 // tail records that arrive after the producer stopped
		}
		ph := phaseJSON{Name: name, StartS: from.Seconds(), Seconds: (to - from).Seconds(),
			Produce: lat(summarize(between(prod, from, to)))}
		ph.Tail = tailJSON{latencyJSON: lat(summarize(between(tail, from, hi))),
			MaxLagRecords: summarize(between(lag, from, hi)).Max}
		for _, b := range between(bfb, from, to) {
			ph.BackfillBytes += b
		}
		if name == "backfill" && bf.Seconds > 0 {
			// The consumer's own time: --backfill-min-s may keep the phase longer.
			ph.BackfillMBPerS = float64(bf.Bytes) / 1e6 / bf.Seconds
			if bf.CPUSeconds != nil {
				c := *bf.CPUSeconds / bf.Seconds
				ph.BackfillCPUCores = &c
			}
		}
		ph.Broker = brokerPhase(marks[i], marks[i+1], periodic)
		ph.Broker.RunqMsPerS = perSecond(between(brunq, from, to), 1e3)
		ph.Broker.BenchRunqMsPerS = perSecond(between(benchq, from, to), 1e3)
		ph.Broker.BusiestThreadCore = perSecond(between(busiest, from, to), 1e6)
		ph.Tiers = tiersPhase(keelMarks[i].tiers, keelMarks[i+1].tiers)
		ph.Stages = stagesPhase(keelMarks[i].stages, keelMarks[i+1].stages)
		ph.Quiet = quietPhase(prod, tail, quiet, measured, from, to)
		res.Phases = append(res.Phases, ph)
	}
	res.Timeline = timeline(prod, tail, lag, bfb, periodic, marks[len(marks)-1].at)
	return res
}

func brokerPhase(from, to timedBroker, periodic []timedBroker) brokerJSON {
	var b brokerJSON
	known := func(v int64) *int64 {
		if v < 0 {
			return nil
		}
		return &v
	}
	if from.s.ReadBytes >= 0 && to.s.ReadBytes >= 0 {
		b.DiskReadBytes = known(to.s.ReadBytes - from.s.ReadBytes)
	}
	b.PageCacheBytesEnd, b.RSSBytesEnd = known(to.s.PageCacheBytes), known(to.s.RSSBytes)
	pcMax, rssMax := to.s.PageCacheBytes, to.s.RSSBytes
	for _, p := range periodic {
		if p.at >= from.at && p.at <= to.at {
			pcMax, rssMax = max(pcMax, p.s.PageCacheBytes), max(rssMax, p.s.RSSBytes)
		}
	}
	b.PageCacheBytesMax, b.RSSBytesMax = known(pcMax), known(rssMax)
	secs := (to.at - from.at).Seconds()
	if from.s.CPUTicks >= 0 && to.s.CPUTicks >= 0 && secs > 0 {
		c := float64(to.s.CPUTicks-from.s.CPUTicks) / clockTicksPerS / secs
		b.CPUCores = &c
	}
	if from.s.SelfCPUUs >= 0 && to.s.SelfCPUUs >= 0 && secs > 0 {
		c := float64(to.s.SelfCPUUs-from.s.SelfCPUUs) / 1e6 / secs
		b.BenchCPUCores = &c
	}
	if a, z := from.s.Host, to.s.Host; a.Ok && z.Ok && secs > 0 {
		c := func(x, y int64) float64 { return float64(y-x) / clockTicksPerS / secs }
		b.Host = &hostJSON{Cores: runtime.NumCPU(),
			BusyCores:   c(a.Total-a.Idle-a.IOWait, z.Total-z.Idle-z.IOWait),
			SystemCores: c(a.System, z.System), IRQCores: c(a.IRQ+a.SoftIRQ, z.IRQ+z.SoftIRQ),
			StealCores: c(a.Steal, z.Steal), IOWaitCores: c(a.IOWait, z.IOWait)}
	}
	if from.s.Dev.Ok && to.s.Dev.Ok && secs > 0 {
		b.Device = devPhase(from.s.Dev, to.s.Dev, secs)
	}
	return b
}

// perSecond: the mean over sampling intervals (1 s each, so a rate per
// second) of microsecond values, divided by unit (1e3: ms/s, 1e6: cores);
// nil without samples.
func perSecond(us []int64, unit float64) *float64 {
	if len(us) == 0 {
		return nil
	}
	var sum int64
	for _, v := range us {
		sum += v
	}
	m := float64(sum) / float64(len(us)) / unit
	return &m
}

func devPhase(a, b devStat, secs float64) *devJSON {
	reads, writes := float64(b.ReadIOs-a.ReadIOs), float64(b.WriteIOs-a.WriteIOs)
	d := &devJSON{
		ReadMB:    float64(b.ReadSectors-a.ReadSectors) * 512 / 1e6,
		WriteMB:   float64(b.WriteSectors-a.WriteSectors) * 512 / 1e6,
		ReadIOPS:  reads / secs,
		WriteIOPS: writes / secs,
		UtilPct:   float64(b.IOTicksMs-a.IOTicksMs) / 10 / secs,
	}
	if reads > 0 {
		d.ReadAwaitMs = float64(b.ReadTicksMs-a.ReadTicksMs) / reads
	}
	if writes > 0 {
		d.WriteAwaitMs = float64(b.WriteTicksMs-a.WriteTicksMs) / writes
	}
	return d
}

// timeline: one point per second of the live phases, for plots.
func timeline(prod, tail, lag, bfb []sample, periodic []timedBroker, end time.Duration) []pointJSON {
	var out []pointJSON
	for t := time.Duration(0); t < end; t += time.Second {
		p := pointJSON{TS: t.Seconds(), PageCacheBytes: -1, RSSBytes: -1, BrokerCPUCores: -1, BenchCPUCores: -1,
			HostStealCores: -1}
		ps := summarize(between(prod, t, t+time.Second))
		ts := summarize(between(tail, t, t+time.Second))
		p.ProduceP99Ms, p.ProduceMaxMs = usToMs(ps.P99), usToMs(ps.Max)
		p.TailP99Ms, p.TailMaxMs = usToMs(ts.P99), usToMs(ts.Max)
		p.TailLagMax = summarize(between(lag, t, t+time.Second)).Max
		for _, b := range between(bfb, t, t+time.Second) {
			p.BackfillMB += float64(b) / 1e6
		}
		for i, s := range periodic {
			if s.at >= t && s.at < t+time.Second {
				p.PageCacheBytes, p.RSSBytes = s.s.PageCacheBytes, s.s.RSSBytes
				if i > 0 {
					p.BrokerCPUCores, p.BenchCPUCores = cpuBetween(periodic[i-1], s)
					p.HostStealCores = stealBetween(periodic[i-1], s)
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// stealBetween: the host's steal in cores between two samples (-1: unknown).
func stealBetween(a, b timedBroker) float64 {
	dt := (b.at - a.at).Seconds()
	if !a.s.Host.Ok || !b.s.Host.Ok || dt <= 0 {
		return -1
	}
	return float64(b.s.Host.Steal-a.s.Host.Steal) / clockTicksPerS / dt
}

// cpuBetween: broker and bench CPU in cores between two samples (-1: unknown).
func cpuBetween(a, b timedBroker) (broker, bench float64) {
	broker, bench = -1, -1
	dt := (b.at - a.at).Seconds()
	if dt <= 0 {
		return
	}
	if a.s.CPUTicks >= 0 && b.s.CPUTicks >= 0 {
		broker = float64(b.s.CPUTicks-a.s.CPUTicks) / clockTicksPerS / dt
	}
	if a.s.SelfCPUUs >= 0 && b.s.SelfCPUUs >= 0 {
		bench = float64(b.s.SelfCPUUs-a.s.SelfCPUUs) / 1e6 / dt
	}
	return
}

func writeJSON(path string, res *result) error {
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func printTable(w io.Writer, res *result) {
	c := res.Config
	fmt.Fprintf(w, "catchup on %s, topic %s: %d partition(s), %d keys, records of %d B, live %d records/s (%.2f MB/s), acks=all, client franz-go\n",
		c.Bootstrap, c.Topic, c.Partitions, c.Keys, c.RecordSize, c.RateRecords, float64(c.RateRecords*c.RecordSize)/1e6)
	fmt.Fprintf(w, "preload: %d records, %.1f MB in %.1f s (%.1f MB/s)\n", res.Preload.Records,
		float64(res.Preload.Bytes)/1e6, res.Preload.Seconds, float64(res.Preload.Bytes)/1e6/math.Max(res.Preload.Seconds, 1e-9))
	state := "complete"
	if !res.Backfill.Complete {
		state = "INCOMPLETE (--backfill-max-s reached)"
	}
	fmt.Fprintf(w, "backfill: %d of %d records, %.1f MB in %.1f s (%.1f MB/s), %s\n", res.Backfill.Records,
		res.Backfill.TargetRecords, float64(res.Backfill.Bytes)/1e6, res.Backfill.Seconds,
		float64(res.Backfill.Bytes)/1e6/math.Max(res.Backfill.Seconds, 1e-9), state)
	for _, r := range res.Backfill.Readers {
		fmt.Fprintf(w, "  reader %s from %.0f%%: %d records, %.1f MB, done after %.1f s (%.1f MB/s)%s\n",
			r.ClientID, r.At*100, r.Records, float64(r.Bytes)/1e6, r.Seconds,
			float64(r.Bytes)/1e6/math.Max(r.Seconds, 1e-9), map[bool]string{true: "", false: ", INCOMPLETE"}[r.Complete])
	}
	fmt.Fprintf(w, "setup: %s\n", res.Setup)
	if c := res.Backfill.CPUSeconds; c != nil && res.Backfill.Seconds > 0 {
		fmt.Fprintf(w, "backfill process: %.1f CPU s in %.1f s (%.2f cores)\n", *c, res.Backfill.Seconds, *c/res.Backfill.Seconds)
	}
	if res.ProduceErrors > 0 {
		fmt.Fprintf(w, "produce errors: %d (first: %s)\n", res.ProduceErrors, res.FirstError)
	}
	rows := []struct {
		name string
		f    func(p phaseJSON) string
	}{
		{"seconds", func(p phaseJSON) string { return fmt.Sprintf("%.1f", p.Seconds) }},
		{"produce acks", func(p phaseJSON) string { return fmt.Sprint(p.Produce.Count) }},
		{"produce p50 ms", func(p phaseJSON) string { return ms(p.Produce.P50Ms) }},
		{"produce p99 ms", func(p phaseJSON) string { return ms(p.Produce.P99Ms) }},
		{"produce p999 ms", func(p phaseJSON) string { return ms(p.Produce.P999Ms) }},
		{"produce max ms", func(p phaseJSON) string { return ms(p.Produce.MaxMs) }},
		{"tail records", func(p phaseJSON) string { return fmt.Sprint(p.Tail.Count) }},
		{"tail e2e p50 ms", func(p phaseJSON) string { return ms(p.Tail.P50Ms) }},
		{"tail e2e p99 ms", func(p phaseJSON) string { return ms(p.Tail.P99Ms) }},
		{"tail e2e max ms", func(p phaseJSON) string { return ms(p.Tail.MaxMs) }},
		{"tail max lag (records)", func(p phaseJSON) string { return fmt.Sprint(p.Tail.MaxLagRecords) }},
		{"backfill MB/s", func(p phaseJSON) string { return fmt.Sprintf("%.1f", p.BackfillMBPerS) }},
		{"broker disk read MB", func(p phaseJSON) string { return opt(p.Broker.DiskReadBytes, 1e6) }},
		{"cgroup page cache MiB (end)", func(p phaseJSON) string { return opt(p.Broker.PageCacheBytesEnd, 1<<20) }},
		{"cgroup page cache MiB (max)", func(p phaseJSON) string { return opt(p.Broker.PageCacheBytesMax, 1<<20) }},
		{"broker RSS MiB (max)", func(p phaseJSON) string { return opt(p.Broker.RSSBytesMax, 1<<20) }},
		{"broker CPU cores", func(p phaseJSON) string { return optF(p.Broker.CPUCores) }},
		{"bench CPU cores", func(p phaseJSON) string { return optF(p.Broker.BenchCPUCores) }},
		{"host busy cores", func(p phaseJSON) string { return host(p, func(h *hostJSON) float64 { return h.BusyCores }) }},
		{"host system cores", func(p phaseJSON) string { return host(p, func(h *hostJSON) float64 { return h.SystemCores }) }},
		{"host irq+softirq cores", func(p phaseJSON) string { return host(p, func(h *hostJSON) float64 { return h.IRQCores }) }},
		{"host steal cores", func(p phaseJSON) string { return host(p, func(h *hostJSON) float64 { return h.StealCores }) }},
		{fmt.Sprintf("quiet seconds (steal < %.2f cores)", quietStealCores), func(p phaseJSON) string {
			return quietCell(p, func(q *quietJSON) string { return fmt.Sprintf("%.0f", q.Seconds) })
		}},
		{"quiet produce p99 ms", func(p phaseJSON) string {
			return quietCell(p, func(q *quietJSON) string { return latencyCell(q.Produce) })
		}},
		{"quiet tail e2e p99 ms", func(p phaseJSON) string {
			return quietCell(p, func(q *quietJSON) string { return latencyCell(q.Tail) })
		}},
		{"broker busiest thread cores", func(p phaseJSON) string { return optF(p.Broker.BusiestThreadCore) }},
		{"broker run-queue wait ms/s", func(p phaseJSON) string { return optF(p.Broker.RunqMsPerS) }},
		{"bench run-queue wait ms/s", func(p phaseJSON) string { return optF(p.Broker.BenchRunqMsPerS) }},
		{"backfill process CPU cores", func(p phaseJSON) string { return optF(p.BackfillCPUCores) }},
		{"disk read MB/s", func(p phaseJSON) string { return dev(p, func(d *devJSON) float64 { return d.ReadMB / p.Seconds }) }},
		{"disk write MB/s", func(p phaseJSON) string { return dev(p, func(d *devJSON) float64 { return d.WriteMB / p.Seconds }) }},
		{"disk read await ms", func(p phaseJSON) string { return dev(p, func(d *devJSON) float64 { return d.ReadAwaitMs }) }},
		{"disk write await ms", func(p phaseJSON) string { return dev(p, func(d *devJSON) float64 { return d.WriteAwaitMs }) }},
		{"disk util %", func(p phaseJSON) string { return dev(p, func(d *devJSON) float64 { return d.UtilPct }) }},
		{"colder tier read MB", func(p phaseJSON) string {
			return tierCell(p, func(t *tiersPhaseJSON) string { return mbCell(t.ColdReadBytes) })
		}},
		{"tier copies", func(p phaseJSON) string {
			return tierCell(p, func(t *tiersPhaseJSON) string { return fmt.Sprint(t.Copies) })
		}},
		{"tier copied MB", func(p phaseJSON) string {
			return tierCell(p, func(t *tiersPhaseJSON) string { return mbCell(t.CopiedBytes) })
		}},
		{"tier copy/read failures", func(p phaseJSON) string {
			return tierCell(p, func(t *tiersPhaseJSON) string { return fmt.Sprintf("%d/%d", t.CopyFailures, t.ReadFailures) })
		}},
		{"fast tier MB (end)", func(p phaseJSON) string {
			return tierCell(p, func(t *tiersPhaseJSON) string { return mbCell(t.FastBytesEnd) })
		}},
		{"topic colder-tier MB (end)", func(p phaseJSON) string {
			return tierCell(p, func(t *tiersPhaseJSON) string { return mbCell(t.TopicColderBytes) })
		}},
	}
	fmt.Fprintf(w, "%-28s", "")
	for _, p := range res.Phases {
		fmt.Fprintf(w, " %12s", p.Name)
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		fmt.Fprintf(w, "%-28s", row.name)
		for _, p := range res.Phases {
			fmt.Fprintf(w, " %12s", row.f(p))
		}
		fmt.Fprintln(w)
	}
}

func ms(v float64) string { return fmt.Sprintf("%.2f", v) }

func optF(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *v)
}

func host(p phaseJSON, f func(*hostJSON) float64) string {
	if p.Broker.Host == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", f(p.Broker.Host))
}

// quietCell: "-" without host counters or without quiet seconds.
func quietCell(p phaseJSON, f func(*quietJSON) string) string {
	if p.Quiet == nil || p.Quiet.Seconds == 0 {
		return "-"
	}
	return f(p.Quiet)
}

// latencyCell: the p99, or "-" without samples.
func latencyCell(l latencyJSON) string {
	if l.Count == 0 {
		return "-"
	}
	return ms(l.P99Ms)
}

func dev(p phaseJSON, f func(*devJSON) float64) string {
	if p.Broker.Device == nil || p.Seconds <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", f(p.Broker.Device))
}

func opt(v *int64, unit float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(*v)/unit)
}
