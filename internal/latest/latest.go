// Package latest is the "latest value wins" hand-off between a writer that must never block
// (an informer callback, a Listener's Update, a trigger) and the one goroutine that acts on
// the newest value: the writer stores the value and leaves at most one wake-up pending, the
// reader wakes on it and reads the newest value.
package latest

import "sync"

// Value holds the newest value given to Set and signals, on C, that it changed.
//
// Set stores v and leaves a signal on C without blocking: C has room for one signal, so any
// number of Sets (and Notifys) before the reader receives merge into one, and a reader sees
// only the newest value: it may miss intermediate values, by design. A Set happens before the
// receive from C that its signal (or a later one) causes, so a Get after that receive returns
// that value or a newer one.
//
// The zero Value is ready to use: it holds T's zero value and no signal is pending. A Value
// must not be copied after first use. Its methods are safe for concurrent use by any number
// of writers; C is meant for one reader (with several, each signal wakes just one of them).
// Set, Get and Notify take O(1) time and never block for long.
type Value[T any] struct {
	once sync.Once
	c    chan struct{} // capacity 1: "changed since the reader last woke"

	mu sync.Mutex
	v  T
}

// Signal is a Value that carries nothing: Notify wakes the reader, C is what it waits on.
type Signal = Value[struct{}]

// Set stores v as the newest value and signals C. It never blocks.
func (l *Value[T]) Set(v T) {
	l.mu.Lock()
	l.v = v
	l.mu.Unlock()
	l.Notify()
}

// Get returns the newest value given to Set (T's zero value before the first Set).
func (l *Value[T]) Get() T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.v
}

// Notify signals C without changing the value: the reader wakes and looks again. It never
// blocks; a signal already pending absorbs it.
func (l *Value[T]) Notify() {
	select {
	case l.ch() <- struct{}{}:
	default:
	}
}

// C returns the channel that receives a signal after Set or Notify. It is the same channel for
// the life of the Value.
func (l *Value[T]) C() <-chan struct{} { return l.ch() }

func (l *Value[T]) ch() chan struct{} {
	l.once.Do(func() { l.c = make(chan struct{}, 1) })
	return l.c
}
