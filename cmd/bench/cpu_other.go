//go:build !linux

package main

// sampleCPU is not measured on this system.
func sampleCPU(int) cpuSample { return cpuSample{} }
