//go:build race

package mcf

const raceEnabled = true
