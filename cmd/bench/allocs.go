package main

import "runtime/metrics"

// allocCount is this process's heap allocations so far: their number and bytes.
type allocCount struct {
	objects, bytes uint64
}

// readAllocs reads the runtime's cumulative count of heap allocations, without
// stopping the world as runtime.ReadMemStats does. Tiny objects (small ones
// without pointers, which the runtime packs into 16-byte blocks) count one
// each, as in runtime.MemStats.Mallocs and go test -benchmem; their bytes
// count as the blocks'.
func readAllocs() allocCount {
	s := []metrics.Sample{
		{Name: "/gc/heap/allocs:objects"},
		{Name: "/gc/heap/tiny/allocs:objects"},
		{Name: "/gc/heap/allocs:bytes"},
	}
	metrics.Read(s)
	return allocCount{objects: s[0].Value.Uint64() + s[1].Value.Uint64(), bytes: s[2].Value.Uint64()}
}

func (a allocCount) since(before allocCount) allocCount {
	return allocCount{objects: a.objects - before.objects, bytes: a.bytes - before.bytes}
}
