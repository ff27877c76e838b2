package testkit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestStartChildOutlivesItsCaller: a child with Pdeathsig forked on a thread that then ends (a
// goroutine locked it and returned) is killed at once, which is what StartChild exists for; the
// same child started by StartChild from such a goroutine lives on.
func TestStartChildOutlivesItsCaller(t *testing.T) {
	sleeper := func() *exec.Cmd {
		cmd := exec.Command("sleep", "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd
	}
	// waited is the child's exit (done: cmd.Wait's), or nil if it still runs after d.
	waited := func(done <-chan error, d time.Duration) error {
		select {
		case err := <-done:
			if err == nil {
				return errors.New("exited 0")
			}
			return err
		case <-time.After(d):
			return nil
		}
	}
	// onEndingThread starts cmd with start from a goroutine that locks its thread and returns,
	// which ends the thread, and waits until it has ended. The process's main thread is never
	// ended (the runtime parks it instead), so a goroutine that finds itself there keeps it,
	// locked, until the test ends, and another goroutine tries.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	onEndingThread := func(start func(*exec.Cmd) (<-chan error, error), cmd *exec.Cmd) <-chan error {
		for {
			tid, errc, exited := make(chan int), make(chan error), make(chan (<-chan error), 1)
			go func() {
				runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
				if syscall.Gettid() == syscall.Getpid() {
					tid <- 0
					<-release
					runtime.UnlockOSThread()
					return
				}
				tid <- syscall.Gettid()
				w, err := start(cmd)
				exited <- w
				errc <- err
			}()
			id := <-tid
			if id == 0 {
				continue
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			Eventually(t, 5*time.Second, fmt.Sprintf("thread %d to end", id), func() bool {
				_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", id))
				return err != nil
			})
			return <-exited
		}
	}
	// plainStart is cmd.Start, waited for on another goroutine.
	plainStart := func(cmd *exec.Cmd) (<-chan error, error) {
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		w := make(chan error, 1)
		go func() { w <- cmd.Wait() }()
		return w, nil
	}

	plain := sleeper()
	plainDone := onEndingThread(plainStart, plain)
	t.Cleanup(func() { _ = plain.Process.Kill() })
	var exit *exec.ExitError
	if err := waited(plainDone, 5*time.Second); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("a child forked on a thread that ended: %v, want killed by SIGKILL (the premise of StartChild)", err)
	}

	kept := sleeper()
	keptDone := onEndingThread(StartChild, kept)
	if err := waited(keptDone, 2*time.Second); err != nil {
		t.Fatalf("a child started by StartChild from a thread that ended: %v, want it running", err)
	}
	if err := kept.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := waited(keptDone, 5*time.Second); err == nil {
		t.Fatal("the child StartChild started did not exit when killed")
	}
}
