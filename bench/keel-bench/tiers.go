package main

// Keel's tier counters, read from its admin endpoint (GET /stats) at the
// phase boundaries when --stats-url is given. Other brokers have no such
// endpoint; their phases carry no tier block.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// tierSample: the counters of the `tiers` block of /stats, and the colder
// tier's bytes summed over the topic's partitions. Ok is false when the
// endpoint could not be read.
type tierSample struct {
	Ok            bool
	Copies        int64 `json:"copies"`
	CopiedBytes   int64 `json:"copied_bytes"`
	CopyFailures  int64 `json:"copy_failures"`
	Reads         int64 `json:"reads"`
	ReadBytes     int64 `json:"read_bytes"`
	ReadFailures  int64 `json:"read_failures"`
	FastBytes     int64 `json:"fast_bytes"`
	FastMaxBytes  int64 `json:"fast_max_bytes"`
	ReleasedBytes int64 `json:"released_bytes"`
	// Summed over the topic's partitions (per-partition `tiers`).
	LocalBytes int64
	ColdBytes  int64
}

// tiersPhaseJSON: tier activity during one phase (deltas of counters) and
// the fast tier and colder tier at its end.
type tiersPhaseJSON struct {
	Copies           int64 `json:"copies"`
	CopiedBytes      int64 `json:"copied_bytes"`
	CopyFailures     int64 `json:"copy_failures"`
	ColdReads        int64 `json:"cold_tier_reads"`
	ColdReadBytes    int64 `json:"cold_tier_read_bytes"`
	ReadFailures     int64 `json:"read_failures"`
	ReleasedBytes    int64 `json:"released_bytes"`
	FastBytesEnd     int64 `json:"fast_bytes_end"`
	FastMaxBytes     int64 `json:"fast_max_bytes"`
	TopicLocalBytes  int64 `json:"topic_local_bytes_end"`
	TopicColderBytes int64 `json:"topic_cold_bytes_end"`
}

var statsClient = &http.Client{Timeout: 10 * time.Second}

// keelMark: what Keel's admin endpoint said at a phase boundary.
type keelMark struct {
	tiers  tierSample
	stages stageSample
}

func readKeel(cfg config) keelMark {
	return keelMark{readTiers(cfg.StatsURL, cfg.Topic), readStages(cfg.MetricsURL)}
}

// readTiers fetches url (Keel's /stats) and sums the topic's partitions.
func readTiers(url, topic string) tierSample {
	if url == "" {
		return tierSample{}
	}
	resp, err := statsClient.Get(url)
	if err != nil {
		return tierSample{}
	}
	defer resp.Body.Close()
	var body struct {
		Tiers      tierSample `json:"tiers"`
		Partitions []struct {
			Topic string `json:"topic"`
			Tiers struct {
				LocalBytes int64 `json:"local_bytes"`
				ColdBytes  int64 `json:"cold_bytes"`
			} `json:"tiers"`
		} `json:"partitions"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil {
		return tierSample{}
	}
	s := body.Tiers
	s.Ok = true
	for _, p := range body.Partitions {
		if p.Topic == topic {
			s.LocalBytes += p.Tiers.LocalBytes
			s.ColdBytes += p.Tiers.ColdBytes
		}
	}
	return s
}

func tiersPhase(a, b tierSample) *tiersPhaseJSON {
	if !a.Ok || !b.Ok {
		return nil
	}
	return &tiersPhaseJSON{
		Copies: b.Copies - a.Copies, CopiedBytes: b.CopiedBytes - a.CopiedBytes,
		CopyFailures: b.CopyFailures - a.CopyFailures,
		ColdReads:    b.Reads - a.Reads, ColdReadBytes: b.ReadBytes - a.ReadBytes,
		ReadFailures: b.ReadFailures - a.ReadFailures, ReleasedBytes: b.ReleasedBytes - a.ReleasedBytes,
		FastBytesEnd: b.FastBytes, FastMaxBytes: b.FastMaxBytes,
		TopicLocalBytes: b.LocalBytes, TopicColderBytes: b.ColdBytes,
	}
}

func tierCell(p phaseJSON, f func(*tiersPhaseJSON) string) string {
	if p.Tiers == nil {
		return "-"
	}
	return f(p.Tiers)
}

func mbCell(v int64) string { return fmt.Sprintf("%.1f", float64(v)/1e6) }
