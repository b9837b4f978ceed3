package main

// Broker-side readings taken from /proc, /sys and the memory cgroup: the
// broker process's disk reads, CPU time and resident memory, the page cache
// charged to its cgroup, and the counters of the block device holding its
// data. Every reading is optional: a missing PID, file or field leaves the
// value at -1 ("unknown") instead of failing the benchmark.

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// brokerProbe reads one broker process and, optionally, its memory cgroup.
type brokerProbe struct {
	pid    int    // 0: no process readings
	cgroup string // cgroup directory; "": no cgroup readings
	device string // "MAJ:MIN" of the data dir's block device; "": none
}

// brokerSample is one reading; -1 means "not available".
type brokerSample struct {
	ReadBytes      int64 // /proc/PID/io read_bytes (cumulative, bytes)
	RSSBytes       int64 // /proc/PID/status VmRSS
	PageCacheBytes int64 // cgroup memory.stat: v1 total_cache (or cache), v2 file
	CPUTicks       int64 // /proc/PID/stat utime+stime, all threads, in clock ticks
	SelfCPUUs      int64 // this (bench) process's user+system CPU, microseconds
	Dev            devStat
	Host           hostCPU
}

// hostCPU: the machine's CPU time from the first line of /proc/stat, in
// clock ticks, all CPUs together; Ok is false when unread.
type hostCPU struct {
	Ok                          bool
	Total, Idle, IOWait         int64
	SoftIRQ, Steal, System, IRQ int64
}

func readHostCPU() hostCPU {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostCPU{}
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return hostCPU{}
	}
	v := make([]int64, 8) // user nice system idle iowait irq softirq steal
	var total int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return hostCPU{}
		}
		total += v[i]
	}
	return hostCPU{Ok: true, Total: total, Idle: v[3], IOWait: v[4], SoftIRQ: v[6], Steal: v[7], System: v[2], IRQ: v[5]}
}

// devStat: cumulative counters of /sys/dev/block/MAJ:MIN/stat (see the
// kernel's Documentation/block/stat.rst); Ok is false when unread.
type devStat struct {
	Ok                      bool
	ReadIOs, ReadSectors    int64
	ReadTicksMs             int64
	WriteIOs, WriteSectors  int64
	WriteTicksMs, IOTicksMs int64
}

// clockTicksPerS is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux architecture Go supports (sysconf(_SC_CLK_TCK) needs cgo).
const clockTicksPerS = 100

func (p brokerProbe) sample() brokerSample {
	s := brokerSample{ReadBytes: -1, RSSBytes: -1, PageCacheBytes: -1, CPUTicks: -1, SelfCPUUs: selfCPUUs()}
	if p.pid > 0 {
		dir := filepath.Join("/proc", strconv.Itoa(p.pid))
		if v, ok := readKeyed(filepath.Join(dir, "io"), "read_bytes:"); ok {
			s.ReadBytes = v
		}
		if v, ok := readKeyed(filepath.Join(dir, "status"), "VmRSS:"); ok {
			s.RSSBytes = v * 1024 // the file says kB
		}
		s.CPUTicks = procCPUTicks(p.pid)
	}
	if p.cgroup != "" {
		s.PageCacheBytes = cgroupPageCache(p.cgroup)
	}
	if p.device != "" {
		s.Dev = readDevStat(p.device)
	}
	s.Host = readHostCPU()
	return s
}

// procCPUTicks: utime + stime (fields 14 and 15 of /proc/PID/stat, counting
// threads that already exited), or -1.
func procCPUTicks(pid int) int64 {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return -1
	}
	// The command name (field 2) may hold spaces; fields restart after ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return u + st
}

func selfCPUUs() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano()/1000 + ru.Stime.Nano()/1000
}

func readDevStat(majMin string) devStat {
	data, err := os.ReadFile(filepath.Join("/sys/dev/block", majMin, "stat"))
	if err != nil {
		return devStat{}
	}
	f := strings.Fields(string(data))
	if len(f) < 11 {
		return devStat{}
	}
	v := make([]int64, 11)
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return devStat{}
		}
	}
	// 0 reads, 2 read sectors, 3 read ms, 4 writes, 6 write sectors,
	// 7 write ms, 9 ms with I/O in flight.
	return devStat{true, v[0], v[2], v[3], v[4], v[6], v[7], v[9]}
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

// threadSched: per-thread scheduler counters of a process, from
// /proc/PID/task/TID/schedstat: nanoseconds on a CPU and nanoseconds
// runnable but waiting for one (run-queue delay).
type threadSched map[int]struct{ runNs, waitNs int64 }

func readThreadSched(pid string) threadSched {
	out := threadSched{}
	dir := filepath.Join("/proc", pid, "task")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out
	}
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(data))
		if len(f) < 2 {
			continue
		}
		run, err1 := strconv.ParseInt(f[0], 10, 64)
		wait, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 == nil && err2 == nil {
			out[tid] = struct{ runNs, waitNs int64 }{run, wait}
		}
	}
	return out
}

// schedDelta: over the threads present in both readings, the total
// run-queue wait and the CPU time of the busiest thread, in microseconds.
// Threads that started or ended in between are left out.
func schedDelta(a, b threadSched) (waitUs, busiestRunUs int64) {
	for tid, nb := range b {
		na, ok := a[tid]
		if !ok {
			continue
		}
		waitUs += (nb.waitNs - na.waitNs) / 1000
		busiestRunUs = max(busiestRunUs, (nb.runNs-na.runNs)/1000)
	}
	return waitUs, busiestRunUs
}
