// Package kubetest holds helpers for tests that run informers on client-go's fake clientset.
package kubetest

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// NewClientset is fake.NewClientset whose watches deliver copies of the tracker's objects.
//
// client-go v0.37's object tracker hands a watch the stored objects themselves when it starts
// after a List (k8s.io/client-go/testing/fixture.go, tracker.Watch:
// fakewatcher.Add(obj.Object), where Create and Update send DeepCopyObject()). An informer's
// transform may change the object it is given in place — client-go allows it, and edgeflow's
// trim does — so it wrote to the tracker's own object while a Get deep-copied it: a data race
// that a real apiserver, which decodes a new object for every event, never has (seen in CI:
// rebalancer's TestReleaseGated under -race).
func NewClientset(objs ...runtime.Object) *fake.Clientset {
	return CopyingWatches(fake.NewClientset(objs...))
}

// CopyingWatches makes cs's watches deliver copies (see NewClientset) and returns it.
func CopyingWatches(cs *fake.Clientset) *fake.Clientset {
	tracker := cs.Tracker()
	cs.PrependWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := tracker.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		return true, copying(w), nil
	})
	return cs
}

// copyingWatch passes on the events of in with their objects copied. Not watch.Filter: its
// goroutine blocks for ever on a send once the reader has stopped reading (apimachinery
// v0.37.2, watch/filter.go), which goleak reports; this one returns when stopped.
type copyingWatch struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func copying(in watch.Interface) watch.Interface {
	c := &copyingWatch{in: in, out: make(chan watch.Event), stop: make(chan struct{})}
	go c.loop()
	return c
}

func (c *copyingWatch) loop() {
	defer close(c.out)
	for e := range c.in.ResultChan() {
		if e.Object != nil {
			e.Object = e.Object.DeepCopyObject()
		}
		select {
		case c.out <- e:
		case <-c.stop:
			return
		}
	}
}

func (c *copyingWatch) Stop() {
	c.once.Do(func() {
		close(c.stop)
		c.in.Stop()
	})
}

func (c *copyingWatch) ResultChan() <-chan watch.Event { return c.out }
