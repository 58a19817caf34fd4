package devio

import (
	"sync"
	"testing"
)

// Freed tokens go to the Submit that started first, however often a later one asks.
func TestTokenQueueGrantsInArrivalOrder(t *testing.T) {
	q := newTokenQueue(4)
	a, b, c := q.join(), q.join(), q.join()
	if got := q.take(a, 4); got != 4 {
		t.Fatalf("a took %d of 4 free tokens", got)
	}
	// c asks before b, but b arrived first.
	if got := q.take(c, 2); got != 0 {
		t.Fatalf("c took %d tokens with none free", got)
	}
	if got := q.take(b, 3); got != 0 {
		t.Fatalf("b took %d tokens with none free", got)
	}
	q.release(2)
	if got := q.take(c, 2); got != 0 {
		t.Fatalf("c took %d tokens while b, which arrived first, still waits", got)
	}
	select {
	case <-b.wake:
	default:
		t.Fatal("b was not woken by its grant")
	}
	if got := q.take(b, 3); got != 2 {
		t.Fatalf("b holds %d tokens, want the 2 released", got)
	}
	q.release(2) // 1 more for b, then 1 for c
	if got := q.take(b, 1); got != 1 {
		t.Fatalf("b holds %d tokens, want 1", got)
	}
	if got := q.take(c, 2); got != 1 {
		t.Fatalf("c holds %d tokens, want 1", got)
	}
	// c leaves while still waiting: nothing is lost, a later Submit gets the tokens.
	q.leave(c)
	q.release(4)
	d := q.join()
	if got := q.take(d, 8); got != 4 {
		t.Fatalf("d took %d tokens, want all 4 free", got)
	}
	q.release(4)
	q.leave(a)
	q.leave(b)
	q.leave(d)
	if q.free != 4 || len(q.waiters) != 0 {
		t.Fatalf("after everyone left: %d free, %d waiting; want 4 and 0", q.free, len(q.waiters))
	}
}

// A Submit whose demand shrinks after a grant gives the surplus back.
func TestTokenQueueReturnsSurplusGrant(t *testing.T) {
	q := newTokenQueue(2)
	a, b := q.join(), q.join()
	q.take(a, 2)
	q.take(b, 2)
	q.release(2) // both granted to b
	if got := q.take(b, 1); got != 1 {
		t.Fatalf("b holds %d tokens, want 1", got)
	}
	if got := q.take(a, 1); got != 1 {
		t.Fatalf("a got %d tokens, want the 1 b gave back", got)
	}
}

// Many Submits taking and releasing concurrently never exceed the depth and never lose a
// token (run with -race).
func TestTokenQueueConcurrent(t *testing.T) {
	const depth = 8
	q := newTokenQueue(depth)
	var (
		mu      sync.Mutex
		held    int
		maxHeld int
		wg      sync.WaitGroup
	)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := q.join()
			defer q.leave(w)
			need := 40
			for need > 0 {
				n := q.take(w, min(need, 5))
				if n == 0 {
					<-w.wake
					continue
				}
				mu.Lock()
				held += n
				maxHeld = max(maxHeld, held)
				mu.Unlock()
				mu.Lock()
				held -= n
				mu.Unlock()
				q.release(n)
				need -= n
			}
		}()
	}
	wg.Wait()
	if maxHeld > depth {
		t.Fatalf("%d tokens held at once, depth %d", maxHeld, depth)
	}
	if q.free != depth || len(q.waiters) != 0 {
		t.Fatalf("after all Submits: %d free, %d waiting; want %d and 0", q.free, len(q.waiters), depth)
	}
}
