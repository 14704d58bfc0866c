package main

import "runtime/metrics"

// allocCount is this process's heap allocations so far: their number and bytes.
type allocCount struct {
	objects, bytes uint64
}

// readAllocs reads the runtime's cumulative count of heap allocations, without
// stopping the world as runtime.ReadMemStats does.
func readAllocs() allocCount {
	s := []metrics.Sample{
		{Name: "/gc/heap/allocs:objects"},
		{Name: "/gc/heap/allocs:bytes"},
	}
	metrics.Read(s)
	return allocCount{objects: s[0].Value.Uint64(), bytes: s[1].Value.Uint64()}
}

func (a allocCount) since(before allocCount) allocCount {
	return allocCount{objects: a.objects - before.objects, bytes: a.bytes - before.bytes}
}
