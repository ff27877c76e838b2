package latest

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// pending says whether a signal is waiting on C, taking it if so.
func pending[T any](l *Value[T]) bool {
	select {
	case <-l.C():
		return true
	default:
		return false
	}
}

func TestZeroValue(t *testing.T) {
	var l Value[*int]
	if got := l.Get(); got != nil {
		t.Errorf("Get before Set: %v, want nil", got)
	}
	if pending(&l) {
		t.Error("a signal pending before any Set")
	}
	if c1, c2 := l.C(), l.C(); c1 != c2 {
		t.Error("C returned two channels")
	}
}

func TestSetsMerge(t *testing.T) {
	tests := []struct {
		name string
		do   func(l *Value[int])
		want int
	}{
		{"one Set", func(l *Value[int]) { l.Set(1) }, 1},
		{"three Sets: the newest wins", func(l *Value[int]) { l.Set(1); l.Set(2); l.Set(3) }, 3},
		{"Notify keeps the value", func(l *Value[int]) { l.Set(7); l.Notify() }, 7},
		{"Notify alone", func(l *Value[int]) { l.Notify() }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l Value[int]
			tt.do(&l)
			if !pending(&l) {
				t.Fatal("no signal pending")
			}
			if pending(&l) {
				t.Error("a second signal pending: signals did not merge")
			}
			if got := l.Get(); got != tt.want {
				t.Errorf("Get: %d, want %d", got, tt.want)
			}
		})
	}
}

func TestSignal(t *testing.T) {
	var s Signal
	s.Notify()
	s.Notify()
	if !pending(&s) || pending(&s) {
		t.Error("two Notifys did not leave exactly one signal")
	}
}

// One writer, one reader: each value the reader reads after a wake-up is the one that woke it
// or a newer one (never older than one read before), and the last value is always read.
func TestReaderSeesNewest(t *testing.T) {
	const n = 10000
	var l Value[int]
	done := make(chan []int)
	go func() {
		var seen []int
		for {
			<-l.C()
			v := l.Get()
			seen = append(seen, v)
			if v == n {
				done <- seen
				return
			}
		}
	}()
	for i := 1; i <= n; i++ {
		l.Set(i)
	}
	select {
	case seen := <-done:
		for i := 1; i < len(seen); i++ {
			if seen[i] < seen[i-1] {
				t.Fatalf("read %d after %d", seen[i], seen[i-1])
			}
		}
		t.Logf("%d Sets, %d wake-ups", n, len(seen))
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never read the last value")
	}
}

// Concurrent writers (run under -race): no Set blocks, every value read is one that was set,
// and the reader wakes for the last Set of all.
func TestConcurrentSetters(t *testing.T) {
	const writers, each = 8, 2000
	var l Value[int]
	const last = -1
	done := make(chan error, 1)
	go func() {
		for {
			<-l.C()
			switch v := l.Get(); {
			case v == last:
				done <- nil
				return
			case v < 0 || v >= writers*each:
				done <- fmt.Errorf("read %d, a value never set", v)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				l.Set(w*each + i)
				if i%100 == 0 {
					l.Notify()
				}
			}
		})
	}
	wg.Wait()
	l.Set(last)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never read the last value")
	}
}

func BenchmarkSet(b *testing.B) {
	var l Value[*int]
	x := 1
	for b.Loop() {
		l.Set(&x)
	}
}
