package main

// Keel's request stage histograms, read from its admin endpoint (GET
// /metrics, keel_request_stage_seconds) at the phase boundaries when
// --metrics-url is given: where each phase's produce and fetch time went
// (write syscall, append queue, lock, flush, reads per tier, ...). Other
// brokers have no such endpoint; their phases carry no stage block.

import (
	"bufio"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// stageKey names one histogram: an API and a stage.
type stageKey struct{ api, stage string }

// stageHist is one histogram's cumulative buckets (upper bound in
// seconds -> count), its sum in seconds and its count.
type stageHist struct {
	buckets map[float64]float64
	sum     float64
	count   float64
}

// stageSample is every stage histogram at one instant; nil when the
// endpoint could not be read.
type stageSample map[stageKey]*stageHist

// stageJSON: one stage during one phase.
type stageJSON struct {
	Count  int64   `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	// The upper bound of the bucket holding the 99th percentile: the
	// histogram's buckets double, so this is within 2x above it.
	P99Ms float64 `json:"p99_ms_at_most"`
}

// readStages fetches url (Keel's /metrics) and keeps the stage histograms.
func readStages(url string) stageSample {
	if url == "" {
		return nil
	}
	resp, err := statsClient.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	s := stageSample{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, labels, value, ok := parseSample(sc.Text())
		if !ok || !strings.HasPrefix(name, "keel_request_stage_seconds_") {
			continue
		}
		key := stageKey{labels["api"], labels["stage"]}
		h := s[key]
		if h == nil {
			h = &stageHist{buckets: map[float64]float64{}}
			s[key] = h
		}
		switch strings.TrimPrefix(name, "keel_request_stage_seconds_") {
		case "bucket":
			le, err := strconv.ParseFloat(labels["le"], 64)
			if labels["le"] == "+Inf" {
				le, err = math.Inf(1), nil
			}
			if err == nil {
				h.buckets[le] = value
			}
		case "sum":
			h.sum = value
		case "count":
			h.count = value
		}
	}
	if sc.Err() != nil {
		return nil
	}
	return s
}

// parseSample splits `name{k="v",...} value` (label values without
// escaped quotes, as Keel's are).
func parseSample(line string) (string, map[string]string, float64, bool) {
	if line == "" || line[0] == '#' {
		return "", nil, 0, false
	}
	name, rest := line, ""
	labels := map[string]string{}
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.IndexByte(line, '}')
		if j < i {
			return "", nil, 0, false
		}
		name, rest = line[:i], line[j+1:]
		for _, kv := range strings.Split(line[i+1:j], ",") {
			k, v, ok := strings.Cut(kv, "=")
			if ok {
				labels[k] = strings.Trim(v, `"`)
			}
		}
	} else if i := strings.IndexByte(line, ' '); i >= 0 {
		name, rest = line[:i], line[i:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	return name, labels, v, err == nil
}

// stagesPhase: per API and stage, the requests that went through it
// between a and b, their mean and the bucket of their 99th percentile.
// Only Produce and Fetch are kept: the APIs the scenario measures.
func stagesPhase(a, b stageSample) map[string]map[string]stageJSON {
	if a == nil || b == nil {
		return nil
	}
	out := map[string]map[string]stageJSON{}
	for key, hb := range b {
		if key.api != "Produce" && key.api != "Fetch" {
			continue
		}
		ha := a[key]
		if ha == nil {
			ha = &stageHist{buckets: map[float64]float64{}}
		}
		n := hb.count - ha.count
		if n <= 0 {
			continue
		}
		bounds := make([]float64, 0, len(hb.buckets))
		for le := range hb.buckets {
			bounds = append(bounds, le)
		}
		sort.Float64s(bounds)
		p99 := math.Inf(1)
		for _, le := range bounds {
			if hb.buckets[le]-ha.buckets[le] >= 0.99*n {
				p99 = le
				break
			}
		}
		if out[key.api] == nil {
			out[key.api] = map[string]stageJSON{}
		}
		st := stageJSON{Count: int64(n), MeanMs: (hb.sum - ha.sum) / n * 1e3, P99Ms: p99 * 1e3}
		if math.IsInf(p99, 1) {
			st.P99Ms = -1
		}
		out[key.api][key.stage] = st
	}
	return out
}
