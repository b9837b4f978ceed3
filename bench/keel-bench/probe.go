package main

// Broker-side readings taken from /proc and the memory cgroup: the broker
// process's disk reads, its resident memory, and the page cache charged to its
// cgroup. Every reading is optional: a missing PID, file or field leaves the
// value at -1 ("unknown") instead of failing the benchmark.

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// brokerProbe reads one broker process and, optionally, its memory cgroup.
type brokerProbe struct {
	pid    int    // 0: no process readings
	cgroup string // cgroup directory; "": no cgroup readings
}

// brokerSample is one reading; -1 means "not available".
type brokerSample struct {
	ReadBytes      int64 // /proc/PID/io read_bytes (cumulative, bytes)
	RSSBytes       int64 // /proc/PID/status VmRSS
	PageCacheBytes int64 // cgroup memory.stat: v1 total_cache (or cache), v2 file
}

func (p brokerProbe) sample() brokerSample {
	s := brokerSample{ReadBytes: -1, RSSBytes: -1, PageCacheBytes: -1}
	if p.pid > 0 {
		dir := filepath.Join("/proc", strconv.Itoa(p.pid))
		if v, ok := readKeyed(filepath.Join(dir, "io"), "read_bytes:"); ok {
			s.ReadBytes = v
		}
		if v, ok := readKeyed(filepath.Join(dir, "status"), "VmRSS:"); ok {
			s.RSSBytes = v * 1024 // the file says kB
		}
	}
	if p.cgroup != "" {
		s.PageCacheBytes = cgroupPageCache(p.cgroup)
	}
	return s
}

// cgroupVersion names the memory.stat flavour found in dir: "v1", "v2" or "".
func cgroupVersion(dir string) string {
	stat := filepath.Join(dir, "memory.stat")
	if _, ok := readKeyed(stat, "file"); ok {
		return "v2"
	}
	if _, ok := readKeyed(stat, "cache"); ok {
		return "v1"
	}
	return ""
}

// cgroupPageCache: v1 reports `total_cache` (hierarchical, includes child
// groups) and `cache`; v2 reports `file`. All are bytes.
func cgroupPageCache(dir string) int64 {
	stat := filepath.Join(dir, "memory.stat")
	for _, key := range []string{"total_cache", "cache", "file"} {
		if v, ok := readKeyed(stat, key); ok {
			return v
		}
	}
	return -1
}

// readKeyed returns the first integer after `key` on the line that starts
// with it ("key value" or "key: value kB").
func readKeyed(path, key string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == key {
			v, err := strconv.ParseInt(fields[1], 10, 64)
			return v, err == nil
		}
	}
	return 0, false
}
