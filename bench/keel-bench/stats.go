package main

// Latency samples and exact percentiles. Every sample is kept (16 bytes
// each) and sorted once per phase, so percentiles are exact rather than
// bucketed; a few million samples per run fit easily.

import (
	"math"
	"sort"
	"sync"
	"time"
)

// sample is one observation at `at` (time since the run started).
type sample struct {
	at    time.Duration
	value int64 // latency in microseconds, or lag in records
}

// series is a goroutine-safe list of samples.
type series struct {
	mu sync.Mutex
	s  []sample
}

func (x *series) add(at time.Duration, v int64) {
	x.mu.Lock()
	x.s = append(x.s, sample{at, v})
	x.mu.Unlock()
}

func (x *series) snapshot() []sample {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]sample(nil), x.s...)
}

// between returns the values of samples with from <= at < to.
func between(s []sample, from, to time.Duration) []int64 {
	var out []int64
	for _, v := range s {
		if v.at >= from && v.at < to {
			out = append(out, v.value)
		}
	}
	return out
}

// summary holds exact order statistics of a set of values.
type summary struct {
	Count int64
	P50   int64
	P99   int64
	P999  int64
	Max   int64
}

func summarize(values []int64) summary {
	if len(values) == 0 {
		return summary{}
	}
	sort.Slice(values, func(i, j int) bool { return values[i] < values[j] })
	return summary{
		Count: int64(len(values)),
		P50:   rank(values, 0.50),
		P99:   rank(values, 0.99),
		P999:  rank(values, 0.999),
		Max:   values[len(values)-1],
	}
}

// rank is the nearest-rank percentile of sorted values.
func rank(sorted []int64, q float64) int64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

func usToMs(us int64) float64 { return float64(us) / 1000 }
