package lifecycle

import (
	"sync"
	"testing"
)

// TestCloseWaitsForEnteredTask: a task entered before Close is waited for: Close returns only
// after its Done, and the task sees Closing and Closed while it runs.
func TestCloseWaitsForEnteredTask(t *testing.T) {
	r := NewRunner()
	if !r.Enter() {
		t.Fatal("Enter refused before Close")
	}
	var finished bool // written by the task before Done, read after Close: the race detector checks the order
	taskDone := make(chan struct{})
	go func() {
		<-r.Closed() // Close has begun: it is waiting for this task now, or about to
		if !r.Closing() {
			t.Error("Closed's channel is closed but Closing is false")
		}
		finished = true
		r.Done()
		close(taskDone)
	}()
	if !r.Close() {
		t.Fatal("the first Close returned false")
	}
	if !finished {
		t.Fatal("Close returned before the task entered before it was done")
	}
	<-taskDone
}

// TestEnterAfterCloseRefuses: once Close has begun, Enter registers nothing and returns false;
// a second Close returns false at once.
func TestEnterAfterCloseRefuses(t *testing.T) {
	r := NewRunner()
	if !r.Close() {
		t.Fatal("the first Close returned false")
	}
	if r.Enter() {
		t.Fatal("Enter after Close admitted a task")
	}
	if r.Close() {
		t.Fatal("a second Close returned true")
	}
}

// TestEnterRacingClose: tasks entering while Close runs are either refused or waited for; none
// is admitted after Close has returned. A probe rather than a proof: an Enter that checked
// closing outside closeMu would slip its Add past Close's Wait only in a narrow window, which
// these rounds (and the race detector's WaitGroup checks) hit only sometimes.
func TestEnterRacingClose(t *testing.T) {
	for round := 0; round < 50; round++ {
		r := NewRunner()
		var (
			mu       sync.Mutex
			running  int // tasks admitted and not done
			start    = make(chan struct{})
			entering sync.WaitGroup
		)
		for g := 0; g < 8; g++ {
			entering.Add(1)
			go func() {
				defer entering.Done()
				<-start
				if !r.Enter() {
					return
				}
				mu.Lock()
				running++
				mu.Unlock()
				mu.Lock()
				running--
				mu.Unlock()
				r.Done()
			}()
		}
		close(start)
		r.Close()
		mu.Lock()
		if running != 0 {
			t.Fatalf("round %d: Close returned with %d tasks running", round, running)
		}
		mu.Unlock()
		entering.Wait()
		if r.Enter() {
			t.Fatalf("round %d: Enter after Close admitted a task", round)
		}
	}
}

// TestKickMerges: a Kick holds one request and never blocks the kicker.
func TestKickMerges(t *testing.T) {
	k := NewKick()
	k.Kick()
	k.Kick() // pending already: merged, does not block
	select {
	case <-k:
	default:
		t.Fatal("a kick left no request")
	}
	select {
	case <-k:
		t.Fatal("two kicks left two requests")
	default:
	}
}
