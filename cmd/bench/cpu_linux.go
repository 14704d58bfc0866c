//go:build linux

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on every Linux port
// that Go supports).
const clockTick = 10 * time.Millisecond

// sampleCPU reads the CPU time used so far by this process, by the PostgreSQL
// cluster whose postmaster is pm (0: unknown), and by the whole machine.
func sampleCPU(pm int) cpuSample {
	s := cpuSample{ok: true, server: -1}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return cpuSample{}
	}
	s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if s.busy, s.total = machineCPU(); s.total == 0 {
		return cpuSample{}
	}
	if pm > 0 {
		s.server = clusterCPU(pm)
	}
	return s
}

// machineCPU reads the first line of /proc/stat: the time every CPU spent busy,
// and in all.
func machineCPU() (busy, total time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	// user nice system idle iowait irq softirq steal ...
	for i, v := range f[1:min(len(f), 9)] {
		n, _ := strconv.ParseInt(v, 10, 64)
		d := time.Duration(n) * clockTick
		total += d
		if i != 3 && i != 4 {
			busy += d
		}
	}
	return busy, total
}

// clusterCPU is the CPU time of the postmaster pm, of its live children, and of
// its children that have exited (which the postmaster has reaped: its cutime).
func clusterCPU(pm int) time.Duration {
	f, ok := procStat(pm)
	if !ok {
		return -1
	}
	total := f.utime + f.stime + f.cutime + f.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pm {
			continue
		}
		if c, ok := procStat(pid); ok && c.ppid == pm {
			total += c.utime + c.stime
		}
	}
	return total
}

type procTimes struct {
	ppid                         int
	utime, stime, cutime, cstime time.Duration
}

// procStat reads /proc/<pid>/stat.
func procStat(pid int) (procTimes, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procTimes{}, false
	}
	// The command name, field 2, is in parentheses and may hold anything.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procTimes{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procTimes{}, false
	}
	// f[k] is field k+3: ppid is field 4, utime to cstime fields 14 to 17.
	num := func(k int) int64 { n, _ := strconv.ParseInt(f[k], 10, 64); return n }
	ticks := func(k int) time.Duration { return time.Duration(num(k)) * clockTick }
	return procTimes{ppid: int(num(1)), utime: ticks(11), stime: ticks(12), cutime: ticks(13), cstime: ticks(14)}, true
}
