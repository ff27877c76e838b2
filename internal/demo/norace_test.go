//go:build !race

package demo

const raceDetector = false
