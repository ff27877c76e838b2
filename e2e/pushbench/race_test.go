//go:build race

package main

// raceEnabled: the test builds the servers with -race too (reusing the packages go test built).
const raceEnabled = true
