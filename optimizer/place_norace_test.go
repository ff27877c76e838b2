//go:build !race

package optimizer

// placeRace says the tests run under the race detector, which slows the large instances ~20×.
const placeRace = false
