//go:build race

package main

// raceEnabled is true when the tests run with the race detector: the demo binary
// they start is built with it too.
const raceEnabled = true
