// Package lifecycle holds the engine's task lifecycle: a Runner that admits tasks until Close
// begins and waits for those admitted, and the Kick that wakes a background worker.
//
// Guarantees: a task whose Enter returned true is waited for by Close (Close returns only after
// its Done); an Enter that starts once Close has begun returns false. A Kick never blocks.
package lifecycle
