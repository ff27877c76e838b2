package testkit

import (
	"os/exec"
	"runtime"
)

// StartChild starts cmd, whose SysProcAttr.Pdeathsig should fire when the test binary dies and
// not before, and waits for it: it returns cmd.Start's error, or a channel that receives
// cmd.Wait's once the child has exited. Use it in place of cmd.Start, and do not call cmd.Wait.
//
// The kernel sends the parent-death signal when the *thread* that forked the child ends, not the
// process (prctl(2), PR_SET_PDEATHSIG; golang/go#27505), and Go ends a thread when a goroutine
// that locked it returns without unlocking it, as a test's network-namespace helper does on
// purpose (the thread, in another namespace, must not go back to the pool). cmd.Start forks on
// whatever thread its goroutine runs on; if another goroutine later locks that thread and
// returns, the child is killed mid-test (e2e/install saw etcd and kube-apiserver die this way,
// "exited during start-up", while tests that own a namespace ran beside them). So StartChild
// forks and waits on one goroutine locked to its thread until the child has exited: no other
// goroutine can run on that thread meanwhile, lock it or end it. Then it unlocks, and the thread
// goes back to the pool. The goroutine is the child's: it ends when the child does.
func StartChild(cmd *exec.Cmd) (<-chan error, error) {
	started, exited := make(chan error, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}
