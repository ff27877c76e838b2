//go:build race

package demo

// raceDetector says the tests run under the race detector, which slows the emulated pods and
// the load generator enough that a millisecond can no longer be measured.
const raceDetector = true
