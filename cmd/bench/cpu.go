package main

import "time"

// cpuSample is the CPU time used so far (on Linux; elsewhere ok is false).
type cpuSample struct {
	ok bool
	// self is this process's; server the PostgreSQL cluster's, or -1 when it is
	// not known (a server from DATABASE_URL).
	self, server time.Duration
	// busy is the time every CPU of the machine spent busy, total the time they
	// spent in all.
	busy, total time.Duration
}

// cpuUse is what a mode's timed operations cost in CPU time.
type cpuUse struct {
	// benchPerOp and serverPerOp are this process's and the cluster's CPU time
	// per operation; serverPerOp is negative when not known.
	benchPerOp, serverPerOp time.Duration
	// machineBusy is the share of the machine's CPU time that was busy, and
	// others the share that processes other than this one and its cluster used
	// (other programs on the machine: noise in the figures). Negative when not
	// known.
	machineBusy, others float64
}

func (s cpuSample) since(before cpuSample, n int) cpuUse {
	u := cpuUse{serverPerOp: -1, machineBusy: -1, others: -1}
	if !s.ok || !before.ok || s.total <= before.total {
		return u
	}
	self := s.self - before.self
	u.benchPerOp = self / time.Duration(n)
	total := float64(s.total - before.total)
	busy := float64(s.busy - before.busy)
	u.machineBusy = busy / total
	if s.server >= 0 && before.server >= 0 {
		server := s.server - before.server
		u.serverPerOp = server / time.Duration(n)
		u.others = max(0, busy-float64(self+server)) / total
	}
	return u
}
