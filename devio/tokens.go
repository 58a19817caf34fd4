package devio

import "sync"

// tokenQueue bounds the requests in flight on a device queue shared by concurrent Submits and
// grants its tokens first come, first served: a Submit gets tokens only once every Submit that
// started before it has had all it asked for.
//
// Order matters because callers complete work in order: the log publishes its writes in the
// order they were placed, so a write held back while later ones go ahead holds back every
// acknowledgement after it. Handing freed tokens to whichever waiter woke first (a channel
// semaphore) did exactly that under load: with 2 MiB writes completing in batches, a 64 MiB
// group could wait 200 ms for its last requests while groups placed after it completed.
type tokenQueue struct {
	mu      sync.Mutex
	free    int
	seq     uint64
	waiters []*tokenWaiter // in arrival order, each with want > 0
}

// tokenWaiter is one Submit's claim on the queue.
type tokenWaiter struct {
	seq  uint64
	want int           // tokens asked for and not yet granted
	got  int           // tokens granted and not yet taken
	wake chan struct{} // signalled (capacity 1) when tokens are granted
}

func newTokenQueue(depth int) *tokenQueue { return &tokenQueue{free: depth} }

// join registers a Submit; its place in line is its arrival.
func (q *tokenQueue) join() *tokenWaiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	return &tokenWaiter{seq: q.seq, wake: make(chan struct{}, 1)}
}

// take returns how many tokens (at most n) w now holds for its next requests and records that
// it wants n in all: the rest is granted, in arrival order, as tokens are released, and
// w.wake is signalled then.
func (q *tokenQueue) take(w *tokenWaiter, n int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	got := min(w.got, n)
	w.got -= got
	if w.got > 0 {
		// Granted more than it now needs (its demand shrank): give the surplus back.
		q.free += w.got
		w.got = 0
	}
	// Tokens are free only while nobody waits (grant hands them out at once), so taking them
	// never passes anyone in line.
	k := min(q.free, n-got)
	q.free -= k
	got += k
	w.want = n - got
	q.requeue(w)
	q.grant()
	return got
}

// release returns n tokens and grants them to the oldest waiters.
func (q *tokenQueue) release(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.free += n
	q.grant()
}

// leave withdraws w (its Submit is done) and returns any tokens granted to it.
func (q *tokenQueue) leave(w *tokenWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.free += w.got
	w.got, w.want = 0, 0
	q.requeue(w)
	q.grant()
}

// grant hands free tokens to the waiters in arrival order. Called with mu held.
func (q *tokenQueue) grant() {
	for q.free > 0 && len(q.waiters) > 0 {
		w := q.waiters[0]
		k := min(q.free, w.want)
		q.free -= k
		w.want -= k
		w.got += k
		select {
		case w.wake <- struct{}{}:
		default:
		}
		if w.want > 0 {
			return
		}
		q.waiters = q.waiters[1:]
	}
}

// index returns w's position among the waiters, or -1. Called with mu held.
func (q *tokenQueue) index(w *tokenWaiter) int {
	for i, x := range q.waiters {
		if x == w {
			return i
		}
	}
	return -1
}

// requeue puts w in line by arrival if it wants tokens, and out of line if not. Called with mu
// held.
func (q *tokenQueue) requeue(w *tokenWaiter) {
	i := q.index(w)
	switch {
	case w.want > 0 && i < 0:
		j := len(q.waiters)
		for j > 0 && q.waiters[j-1].seq > w.seq {
			j--
		}
		q.waiters = append(q.waiters, nil)
		copy(q.waiters[j+1:], q.waiters[j:])
		q.waiters[j] = w
	case w.want == 0 && i >= 0:
		q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
	}
}
