//go:build !race

package kube

// raceEnabled: the tests run under the race detector, which slows the code they time ~10×.
const raceEnabled = false
