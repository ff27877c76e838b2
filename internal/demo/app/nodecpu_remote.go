package app

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"
	"time"
)

// A node's cores shared by pods that are processes of their own (the netns testbed's fake
// kubelet runs each pod as one): ServeNodeCPU serves a NodeCPU on a listener (a Unix socket,
// which every network namespace of the machine reaches), and each pod's DialNodeCPU makes a
// NodeCPU that holds its requests' cores there. One exchange per request, while the pod holds
// its own queue: 16 bytes out (the earliest start and the unscaled service time, nanoseconds,
// the start as Unix time: the processes share the machine's clock), 16 back (start, finish).

// ServeNodeCPU answers core requests on lis with n until ctx is done; then it closes lis and
// every connection, waits for their goroutines and returns nil (or the listener's error).
func ServeNodeCPU(ctx context.Context, lis net.Listener, n *NodeCPU) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	closeAll := func() {
		lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	}
	stop := context.AfterFunc(ctx, closeAll)
	defer func() {
		stop()
		closeAll()
		wg.Wait()
	}()
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("app: node %s: cores: %w", n.name, err)
		}
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		wg.Add(1)
		go func() { // ends when the pod hangs up or ServeNodeCPU closes the connection
			defer wg.Done()
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			}()
			var in, out [16]byte
			for {
				if _, err := io.ReadFull(c, in[:]); err != nil {
					return
				}
				earliest := time.Unix(0, int64(binary.LittleEndian.Uint64(in[:8])))
				service := time.Duration(binary.LittleEndian.Uint64(in[8:]))
				if service < 0 {
					return
				}
				start, finish := n.hold(earliest, service)
				binary.LittleEndian.PutUint64(out[:8], uint64(start.UnixNano()))
				binary.LittleEndian.PutUint64(out[8:], uint64(finish.UnixNano()))
				if _, err := c.Write(out[:]); err != nil {
					return
				}
			}
		}()
	}
}

// StartNodeCPU serves n on a Unix socket at path (a stale file there is replaced) until stop is
// called; stop closes it and every connection, waits, and returns ServeNodeCPU's error.
func StartNodeCPU(path string, n *NodeCPU) (stop func() error, err error) {
	os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("app: node %s: cores: %w", n.name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeNodeCPU(ctx, lis, n) }() // ends at stop
	return func() error { cancel(); return <-done }, nil
}

// DialNodeCPU connects to the node's cores served at the Unix socket path (ServeNodeCPU) and
// returns them as a NodeCPU for the pod's Config (its speed and core count are the server's).
// Close it when the pod is done. If the server goes away, the pod's requests take no core
// (the node's cores then bind nothing), logged once: a testbed that lost its core server shows
// it in the pod's log, and the pod keeps serving.
func DialNodeCPU(name, path string) (*NodeCPU, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("app: node %s: cores at %s: %w", name, path, err)
	}
	return &NodeCPU{name: name, speed: 1, remote: &coreClient{conn: c, node: name}}, nil
}

// Close hangs up a NodeCPU of DialNodeCPU; nil for any other.
func (n *NodeCPU) Close() error {
	if n == nil || n.remote == nil {
		return nil
	}
	return n.remote.conn.Close()
}

// coreClient is a pod's connection to its node's cores.
type coreClient struct {
	node string
	mu   sync.Mutex
	conn net.Conn
	lost bool // the connection failed: requests take no core since
}

// hold asks the node for a core (NodeCPU.hold, across the socket).
func (c *coreClient) hold(earliest time.Time, service time.Duration) (start, finish time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lost {
		var buf [16]byte
		binary.LittleEndian.PutUint64(buf[:8], uint64(earliest.UnixNano()))
		binary.LittleEndian.PutUint64(buf[8:], uint64(service))
		_, err := c.conn.Write(buf[:])
		if err == nil {
			_, err = io.ReadFull(c.conn, buf[:])
		}
		if err == nil {
			return time.Unix(0, int64(binary.LittleEndian.Uint64(buf[:8]))), time.Unix(0, int64(binary.LittleEndian.Uint64(buf[8:])))
		}
		c.lost = true
		if !errors.Is(err, net.ErrClosed) {
			log.Printf("app: node %s: cores lost (%v): requests take no core from now on", c.node, err)
		}
	}
	return earliest, earliest.Add(service)
}
