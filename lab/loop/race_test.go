//go:build race

package loop

// raceEnabled shortens the prompts of the tests under the race detector, which makes the
// model's forward pass tens of times slower.
const raceEnabled = true
