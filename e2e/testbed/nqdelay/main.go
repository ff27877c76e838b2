// Command nqdelay delays IPv4 packets in userspace, a replacement for `tc qdisc … netem delay`
// on kernels built without sch_netem. It binds an NFQUEUE over raw nfnetlink (no cgo, no
// libnetfilter_queue), reads the IPv4 source and destination of every queued packet, and
// accepts the packet once the one-way delay configured for that directed pair has passed.
// Each directed pair has its own FIFO (packets are never reordered, as netem without
// reordering). One thread does all the work in an epoll loop: it drains the queue's socket,
// releases every packet whose time has come, sends their verdicts in one system call, and
// sleeps on one timerfd armed for the earliest packet still held, which wakes at hrtimer
// precision (time.Sleep overshoots by 0.2–0.7 ms on a busy machine). (A goroutine and a timerfd
// per pair, a channel send and a verdict system call per packet, cost up to 1.4 of the 2 cores
// at 200 req/s of cross-node calls: the testbed's saturation at high load.) Run it at real-time
// priority (`chrt -f 20 nqdelay …`): without it, releases are late by up to tens of
// milliseconds when the machine is loaded.
//
// Usage:
//
//	nqdelay -matrix FILE [-queue N] [-early DURATION]
//
// The matrix file has one line per unordered pair; '#' starts a comment, up to the end of the line:
//
//	<ipA> <ipB> <rtt_ms> [jitter_ms]
//
// Each direction is held rtt_ms/2, plus normally distributed jitter with standard deviation
// jitter_ms per direction (clamped at zero, never reordering). Pairs not listed pass undelayed.
// A line
//
//	tcp <ipSrc> <ipDst> <extra_ms>
//
// holds the TCP packets from ipSrc to ipDst extra_ms more, in one direction only: a cost that
// requests pay and ICMP does not see (an L7 penalty: a sidecar, a middlebox). Those packets
// have a FIFO of their own, so the pair's ICMP never waits behind them.
//
// Signals: SIGHUP reloads the matrix file and logs "nqdelay: reloaded N directed pairs from
// FILE", or "nqdelay: reload FILE: ERROR" keeping the previous matrix; SIGUSR1 logs per-pair
// statistics of release lateness (a line per pair, then "nqdelay: statistics end"); SIGINT and SIGTERM log the statistics and exit with status 0.
// Once the queue is bound it logs "nqdelay: queue N bound".
//
// Typical use, with a bridge in its own network namespace:
//
//	sysctl -w net.bridge.bridge-nf-call-iptables=1
//	iptables -A FORWARD -m physdev --physdev-is-bridged -j NFQUEUE --queue-num 0
//	chrt -f 20 nqdelay -queue 0 -matrix matrix.txt
//
// Without --queue-bypass on the iptables rule, packets are dropped while nqdelay is not running.
package main

import (
	"bufio"
	"container/heap"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// nfnetlink_queue constants (linux/netfilter/nfnetlink_queue.h).
const (
	nfnlSubsysQueue  = 3
	nfqnlMsgPacket   = 0
	nfqnlMsgVerdict  = 1
	nfqnlMsgConfig   = 2
	nfqaPacketHdr    = 1
	nfqaVerdictHdr   = 2
	nfqaPayload      = 10
	nfqaCfgCmd       = 1
	nfqaCfgParams    = 2
	nfqaCfgQueueMax  = 3
	nfqaCfgMask      = 4
	nfqaCfgFlags     = 5
	cfgCmdBind       = 1
	copyPacket       = 2
	cfgFlagGSO       = 4
	nfAccept         = 1
	solNetlink       = 270
	netlinkNoENOBUFS = 5

	copyBytes   = 128     // bytes of each packet copied to userspace: the IPv4 header is enough
	queueMaxLen = 65536   // packets the kernel holds for us before it drops
	statsWindow = 4096    // release lateness samples kept per pair for percentiles
	maxBatch    = 1 << 16 // bytes of verdicts sent at most in one system call (2,048 verdicts)
)

func main() {
	queue := flag.Uint("queue", 0, "NFQUEUE number to bind (0–65535)")
	matrix := flag.String("matrix", "", "matrix file: lines `ipA ipB rtt_ms [jitter_ms]` (required)")
	early := flag.Duration("early", 0, "release this much before the target to compensate timer and syscall latency (e.g. 150us)")
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	if *matrix == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *queue > math.MaxUint16 {
		log.Fatalf("nqdelay: queue %d out of range 0–65535", *queue)
	}
	if err := run(uint16(*queue), *matrix, *early); err != nil {
		log.Fatal(err)
	}
}

// run binds the queue and serves it until SIGINT or SIGTERM, or until reading the queue fails.
func run(queue uint16, matrixPath string, early time.Duration) error {
	m, err := loadMatrix(matrixPath)
	if err != nil {
		return err
	}
	// Subscribe before binding so a signal sent right after the "bound" line is never lost.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGINT, syscall.SIGTERM)
	d := &daemon{queue: queue, early: early, matrix: m, pairs: map[pairKey]*pairQueue{},
		rng: rand.New(rand.NewPCG(1, 2))}
	if err := d.open(); err != nil {
		return err
	}
	log.Printf("nqdelay: queue %d bound, %d directed pairs configured, pid %d", queue, len(m), os.Getpid())
	readErr := make(chan error, 1)
	go func() { readErr <- d.loop() }()
	for {
		select {
		case err := <-readErr:
			d.logStats()
			return err
		case s := <-sig:
			switch s {
			case syscall.SIGHUP:
				m, err := loadMatrix(matrixPath)
				if err != nil {
					log.Printf("nqdelay: reload %s: %v", matrixPath, err)
					continue
				}
				d.setMatrix(m)
				log.Printf("nqdelay: reloaded %d directed pairs from %s", len(m), matrixPath)
			case syscall.SIGUSR1:
				d.logStats()
			default:
				d.logStats()
				log.Printf("nqdelay: %v, exiting", s)
				return nil
			}
		}
	}
}

// pairKey is a directed pair of IPv4 addresses; tcp marks the queue of its TCP packets held
// longer (a matrix entry's key never has it).
type pairKey struct {
	src, dst netip.Addr
	tcp      bool
}

func (k pairKey) String() string {
	if k.tcp {
		return k.src.String() + "→" + k.dst.String() + " (tcp)"
	}
	return k.src.String() + "→" + k.dst.String()
}

// delaySpec is the delay of one direction of a pair; tcpExtra is added to its TCP packets.
type delaySpec struct{ oneWay, jitter, tcpExtra time.Duration }

// packet is a queued packet waiting for its verdict.
type packet struct {
	id  uint32
	due int64 // CLOCK_MONOTONIC nanoseconds
}

// pairQueue holds the packets of one directed pair in FIFO order until their due time.
type pairQueue struct {
	key     pairKey
	fifo    []packet // held, oldest first; only the loop touches it
	lastDue int64    // the due time of the last packet queued
	at      int      // its index in the daemon's heap; -1 while it holds no packet

	mu       sync.Mutex // guards the statistics below
	n        int64
	sumLate  float64   // µs
	maxLate  float64   // µs
	lateness []float64 // ring of the last statsWindow lateness samples, µs
}

// record adds one release's lateness (µs) to the statistics.
func (p *pairQueue) record(late float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.lateness) < statsWindow {
		p.lateness = append(p.lateness, late)
	} else {
		p.lateness[p.n%statsWindow] = late
	}
	p.n++
	p.sumLate += late
	p.maxLate = max(p.maxLate, late)
}

// heads is a min-heap of the pairs that hold packets, by their oldest packet's due time.
type heads []*pairQueue

func (h heads) Len() int           { return len(h) }
func (h heads) Less(i, j int) bool { return h[i].fifo[0].due < h[j].fifo[0].due }
func (h heads) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].at, h[j].at = i, j }
func (h *heads) Push(x any)        { p := x.(*pairQueue); p.at = len(*h); *h = append(*h, p) }
func (h *heads) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h, p.at = old[:len(old)-1], -1
	return p
}

// daemon serves one NFQUEUE.
type daemon struct {
	fd    int
	queue uint16
	early time.Duration
	seq   atomic.Uint32

	matrixMu sync.RWMutex
	matrix   map[pairKey]delaySpec

	pairsMu sync.Mutex // guards the map; the queues' packets are the loop's alone
	pairs   map[pairKey]*pairQueue

	// The loop's own state (and request's, before the loop starts).
	rng      *rand.Rand
	held     heads
	verdicts []byte       // verdict messages not yet sent
	released []*pairQueue // the pairs of the packets whose verdicts are in verdicts (nil: not delayed)
	dues     []int64      // and their due times
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func nlAttr(typ uint16, data []byte) []byte {
	l := 4 + len(data)
	b := make([]byte, (l+3)&^3)
	binary.LittleEndian.PutUint16(b[0:], uint16(l))
	binary.LittleEndian.PutUint16(b[2:], typ)
	copy(b[4:], data)
	return b
}

// nlMsg builds an nfnetlink message for our queue and returns it with its sequence number.
func (d *daemon) nlMsg(msgType, flags uint16, attrs ...[]byte) ([]byte, uint32) {
	body := []byte{unix.AF_UNSPEC, 0 /* NFNETLINK_V0 */, byte(d.queue >> 8), byte(d.queue)}
	for _, a := range attrs {
		body = append(body, a...)
	}
	seq := d.seq.Add(1)
	b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.LittleEndian.PutUint32(b[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.LittleEndian.PutUint16(b[4:], nfnlSubsysQueue<<8|msgType)
	binary.LittleEndian.PutUint16(b[6:], flags)
	binary.LittleEndian.PutUint32(b[8:], seq)
	return append(b, body...), seq
}

func (d *daemon) send(b []byte) error {
	return unix.Sendto(d.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// request sends a configuration message and waits for its acknowledgement. Packets that
// arrive meanwhile are handled as usual.
func (d *daemon) request(what string, attrs ...[]byte) error {
	b, seq := d.nlMsg(nfqnlMsgConfig, unix.NLM_F_REQUEST|unix.NLM_F_ACK, attrs...)
	if err := d.send(b); err != nil {
		return fmt.Errorf("nqdelay: %s queue %d: send: %w", what, d.queue, err)
	}
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(d.fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("nqdelay: %s queue %d: waiting for the acknowledgement: %w", what, d.queue, err)
		}
		acked, err := d.dispatch(buf[:n], monoNow(), seq)
		d.flush() // packets that are not delayed; held ones wait for the loop
		if acked {
			if err != nil {
				return fmt.Errorf("nqdelay: %s queue %d: %w", what, d.queue, err)
			}
			return nil
		}
	}
}

// open creates the netlink socket, binds the queue and configures packet copying.
func (d *daemon) open() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("nqdelay: netfilter netlink socket: %w", err)
	}
	d.fd = fd
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("nqdelay: bind netlink socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, solNetlink, netlinkNoENOBUFS, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	// A lost acknowledgement must not hang us forever while configuring.
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("nqdelay: receive timeout: %w", err)
	}
	if err := d.request("bind", nlAttr(nfqaCfgCmd, []byte{cfgCmdBind, 0, 0, unix.AF_INET})); err != nil {
		return err
	}
	params := make([]byte, 5)
	binary.BigEndian.PutUint32(params, copyBytes)
	params[4] = copyPacket
	qmax := binary.BigEndian.AppendUint32(nil, queueMaxLen)
	flags := binary.BigEndian.AppendUint32(nil, cfgFlagGSO)
	if err := d.request("configure", nlAttr(nfqaCfgParams, params), nlAttr(nfqaCfgQueueMax, qmax),
		nlAttr(nfqaCfgMask, flags), nlAttr(nfqaCfgFlags, flags)); err != nil {
		return err
	}
	tv = unix.Timeval{}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("nqdelay: clear receive timeout: %w", err)
	}
	return nil
}

// accept adds the NF_ACCEPT verdict for packet id to the batch flush sends; p and due, when p
// is set, are the pair it was held for and its due time, for the lateness statistics.
// The message is nlMsg's with one nlAttr, written in place: accept runs once per packet.
func (d *daemon) accept(id uint32, p *pairQueue, due int64) {
	const size = unix.NLMSG_HDRLEN + 4 + 4 + 8 // header, nfgenmsg, attribute header, verdict
	b := d.verdicts
	b = binary.LittleEndian.AppendUint32(b, size)
	b = binary.LittleEndian.AppendUint16(b, nfnlSubsysQueue<<8|nfqnlMsgVerdict)
	b = binary.LittleEndian.AppendUint16(b, unix.NLM_F_REQUEST)
	b = binary.LittleEndian.AppendUint32(b, d.seq.Add(1))
	b = binary.LittleEndian.AppendUint32(b, 0) // port id: the kernel's
	b = append(b, unix.AF_UNSPEC, 0 /* NFNETLINK_V0 */, byte(d.queue>>8), byte(d.queue))
	b = binary.LittleEndian.AppendUint16(b, 4+8)
	b = binary.LittleEndian.AppendUint16(b, nfqaVerdictHdr)
	b = binary.BigEndian.AppendUint32(b, nfAccept)
	d.verdicts = binary.BigEndian.AppendUint32(b, id)
	d.released = append(d.released, p)
	d.dues = append(d.dues, due)
	if len(d.verdicts) >= maxBatch {
		d.flush()
	}
}

// flush sends the verdicts batched so far in one system call (the kernel reads every netlink
// message of a datagram) and records the lateness of the held packets among them.
func (d *daemon) flush() {
	if len(d.verdicts) == 0 {
		return
	}
	if err := d.send(d.verdicts); err != nil {
		log.Printf("nqdelay: %d verdicts: %v", len(d.released), err)
	}
	now := monoNow()
	for i, p := range d.released {
		if p != nil {
			p.record(float64(now-d.dues[i]) / 1e3)
		}
	}
	d.verdicts, d.released, d.dues = d.verdicts[:0], d.released[:0], d.dues[:0]
}

func (d *daemon) setMatrix(m map[pairKey]delaySpec) {
	d.matrixMu.Lock()
	defer d.matrixMu.Unlock()
	d.matrix = m
}

func (d *daemon) lookup(k pairKey) delaySpec {
	d.matrixMu.RLock()
	defer d.matrixMu.RUnlock()
	return d.matrix[pairKey{src: k.src, dst: k.dst}]
}

// pair returns the queue of k, creating it on first use.
func (d *daemon) pair(k pairKey) *pairQueue {
	d.pairsMu.Lock()
	defer d.pairsMu.Unlock()
	p := d.pairs[k]
	if p == nil {
		p = &pairQueue{key: k, at: -1}
		d.pairs[k] = p
	}
	return p
}

// releaseDue accepts, pair by pair in FIFO order, every held packet due by now.
func (d *daemon) releaseDue(now int64) {
	for len(d.held) > 0 && d.held[0].fifo[0].due <= now {
		p := d.held[0]
		pkt := p.fifo[0]
		p.fifo = p.fifo[1:]
		d.accept(pkt.id, p, pkt.due)
		if len(p.fifo) == 0 {
			p.fifo = p.fifo[:0:0] // let the drained backing array go
			heap.Pop(&d.held)
		} else {
			heap.Fix(&d.held, 0)
		}
	}
}

// handle schedules one queued packet. Only the reading goroutine calls it.
func (d *daemon) handle(payload []byte, id uint32, recv int64) {
	if len(payload) < 20 || payload[0]>>4 != 4 {
		d.accept(id, nil, 0)
		return
	}
	k := pairKey{src: netip.AddrFrom4([4]byte(payload[12:16])), dst: netip.AddrFrom4([4]byte(payload[16:20]))}
	spec := d.lookup(k)
	k.tcp = spec.tcpExtra > 0 && payload[9] == unix.IPPROTO_TCP
	if spec.oneWay == 0 && spec.jitter == 0 && !k.tcp {
		d.accept(id, nil, 0)
		return
	}
	delay := spec.oneWay
	if k.tcp {
		delay += spec.tcpExtra
	}
	if spec.jitter > 0 {
		delay = max(0, delay+time.Duration(d.rng.NormFloat64()*float64(spec.jitter)))
	}
	p := d.pair(k)
	due := max(recv+int64(delay)-int64(d.early), p.lastDue) // FIFO: never before the previous packet
	p.lastDue = due
	p.fifo = append(p.fifo, packet{id: id, due: due})
	if p.at < 0 {
		heap.Push(&d.held, p)
	}
}

// dispatch handles the netlink messages in b: queued packets go to handle. It reports whether
// b held the acknowledgement of request seq (0: none expected) and that request's error.
func (d *daemon) dispatch(b []byte, recv int64, seq uint32) (acked bool, err error) {
	for len(b) >= unix.NLMSG_HDRLEN {
		mlen := int(binary.LittleEndian.Uint32(b[0:]))
		mtype := binary.LittleEndian.Uint16(b[4:])
		if mlen < unix.NLMSG_HDRLEN || mlen > len(b) {
			return acked, err
		}
		msg := b[unix.NLMSG_HDRLEN:mlen]
		switch {
		case mtype == nfnlSubsysQueue<<8|nfqnlMsgPacket && len(msg) >= 4:
			id, payload, ok := parsePacket(msg[4:])
			if ok {
				d.handle(payload, id, recv)
			}
		case mtype == unix.NLMSG_ERROR && len(msg) >= 4+unix.NLMSG_HDRLEN:
			var e error
			if errno := int32(binary.LittleEndian.Uint32(msg)); errno != 0 {
				e = syscall.Errno(-errno)
			}
			if s := binary.LittleEndian.Uint32(msg[4+8:]); seq != 0 && s == seq {
				acked, err = true, e
			} else if e != nil {
				log.Printf("nqdelay: netlink error for message %d: %v", s, e)
			}
		}
		adv := (mlen + 3) &^ 3
		if adv > len(b) {
			break
		}
		b = b[adv:]
	}
	return acked, err
}

// parsePacket returns the packet id and the copied payload from a packet message's attributes.
func parsePacket(attrs []byte) (id uint32, payload []byte, ok bool) {
	for len(attrs) >= 4 {
		alen := int(binary.LittleEndian.Uint16(attrs[0:]))
		atyp := binary.LittleEndian.Uint16(attrs[2:]) & 0x3fff
		if alen < 4 || alen > len(attrs) {
			break
		}
		data := attrs[4:alen]
		switch atyp {
		case nfqaPacketHdr:
			if len(data) >= 4 {
				id, ok = binary.BigEndian.Uint32(data[0:4]), true
			}
		case nfqaPayload:
			payload = data
		}
		adv := (alen + 3) &^ 3
		if adv > len(attrs) {
			break
		}
		attrs = attrs[adv:]
	}
	return id, payload, ok
}

// loop serves the queue on one locked thread until receiving fails: it waits in epoll for the
// queue's socket or the timerfd, drains the socket (releasing what fell due every so many
// packets), releases every packet due, sends the verdicts in one system call and arms the
// timerfd for the earliest packet still held.
func (d *daemon) loop() error {
	runtime.LockOSThread()
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("nqdelay: timerfd: %w", err)
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("nqdelay: epoll: %w", err)
	}
	for _, fd := range []int{d.fd, tfd} {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return fmt.Errorf("nqdelay: epoll add: %w", err)
		}
	}
	buf := make([]byte, 1<<20)
	events := make([]unix.EpollEvent, 2)
	tick := make([]byte, 8)
	var armed int64 // the due time the timerfd is armed for; 0: disarmed
	for {
		n, err := unix.EpollWait(ep, events, -1)
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("nqdelay: epoll wait: %w", err)
		}
		for _, ev := range events[:max(n, 0)] {
			if int(ev.Fd) == tfd {
				if _, err := unix.Read(tfd, tick); err == nil {
					armed = 0 // it fired
				}
			}
		}
		for n := 0; ; n++ {
			m, _, err := unix.Recvfrom(d.fd, buf, unix.MSG_DONTWAIT)
			if err == unix.EAGAIN {
				break
			}
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.ENOBUFS:
				log.Printf("nqdelay: queue %d: the kernel dropped packets (ENOBUFS)", d.queue)
				continue
			case err != nil:
				return fmt.Errorf("nqdelay: read queue %d: %w", d.queue, err)
			}
			d.dispatch(buf[:m], monoNow(), 0)
			if n%64 == 63 { // a steady stream must not hold back what fell due
				d.releaseDue(monoNow())
				d.flush()
			}
		}
		d.releaseDue(monoNow())
		d.flush()
		next := int64(0)
		if len(d.held) > 0 {
			next = d.held[0].fifo[0].due
		}
		if next != armed {
			its := unix.ItimerSpec{Value: unix.NsecToTimespec(next)} // 0 disarms
			if err := unix.TimerfdSettime(tfd, unix.TFD_TIMER_ABSTIME, &its, nil); err != nil {
				return fmt.Errorf("nqdelay: arm timerfd: %w", err)
			}
			armed = next
		}
	}
}

// loadMatrix reads a matrix file; see the package documentation for its format.
func loadMatrix(path string) (map[pairKey]delaySpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("nqdelay: %w", err)
	}
	defer f.Close()
	m := map[pairKey]delaySpec{}
	extra := map[pairKey]time.Duration{}
	sc := bufio.NewScanner(f)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "tcp "); ok {
			x, a, b, err := parseTCPLine(rest)
			if err != nil {
				return nil, fmt.Errorf("nqdelay: %s:%d: %q: %w", path, lineNo, line, err)
			}
			extra[pairKey{src: a, dst: b}] = x
			continue
		}
		spec, a, b, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("nqdelay: %s:%d: %q: %w", path, lineNo, line, err)
		}
		m[pairKey{src: a, dst: b}] = spec
		m[pairKey{src: b, dst: a}] = spec
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("nqdelay: %s: %w", path, err)
	}
	for k, x := range extra { // whatever the order of the lines
		spec := m[k]
		spec.tcpExtra = x
		m[k] = spec
	}
	return m, nil
}

func parseLine(line string) (spec delaySpec, a, b netip.Addr, err error) {
	fs := strings.Fields(line)
	if len(fs) < 3 || len(fs) > 4 {
		return spec, a, b, errors.New("want `ipA ipB rtt_ms [jitter_ms]`")
	}
	if a, err = netip.ParseAddr(fs[0]); err != nil || !a.Is4() {
		return spec, a, b, fmt.Errorf("ipA %q is not an IPv4 address", fs[0])
	}
	if b, err = netip.ParseAddr(fs[1]); err != nil || !b.Is4() {
		return spec, a, b, fmt.Errorf("ipB %q is not an IPv4 address", fs[1])
	}
	ms := func(s, name string) (time.Duration, error) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return 0, fmt.Errorf("%s %q is not a non-negative number of milliseconds", name, s)
		}
		return time.Duration(v * float64(time.Millisecond)), nil
	}
	rtt, err := ms(fs[2], "rtt_ms")
	if err != nil {
		return spec, a, b, err
	}
	spec.oneWay = rtt / 2
	if len(fs) == 4 {
		if spec.jitter, err = ms(fs[3], "jitter_ms"); err != nil {
			return spec, a, b, err
		}
	}
	return spec, a, b, nil
}

// parseTCPLine parses a `tcp` line's fields after "tcp ": `ipSrc ipDst extra_ms`.
func parseTCPLine(fields string) (extra time.Duration, a, b netip.Addr, err error) {
	fs := strings.Fields(fields)
	if len(fs) != 3 {
		return 0, a, b, errors.New("want `tcp ipSrc ipDst extra_ms`")
	}
	spec, a, b, err := parseLine(strings.Join(fs, " ")) // the same fields as a pair's line
	if err != nil {
		return 0, a, b, err
	}
	return 2 * spec.oneWay, a, b, nil
}

// logStats logs, per directed pair, its target delay, packet count and release lateness.
func (d *daemon) logStats() {
	d.pairsMu.Lock()
	keys := make([]pairKey, 0, len(d.pairs))
	for k := range d.pairs {
		keys = append(keys, k)
	}
	d.pairsMu.Unlock()
	slices.SortFunc(keys, func(a, b pairKey) int {
		if c := a.src.Compare(b.src); c != 0 {
			return c
		}
		return a.dst.Compare(b.dst)
	})
	for _, k := range keys {
		p := d.pair(k)
		p.mu.Lock()
		n, sum, mx := p.n, p.sumLate, p.maxLate
		e := slices.Clone(p.lateness)
		p.mu.Unlock()
		if n == 0 {
			continue
		}
		slices.Sort(e)
		q := func(x float64) float64 { return e[int(x*float64(len(e)-1))] }
		log.Printf("nqdelay: %v: target %v, %d packets, release lateness µs mean=%.0f max=%.0f sum=%.0f, last %d: p50=%.0f p90=%.0f p99=%.0f",
			k, d.lookup(k).oneWay, n, sum/float64(n), mx, sum, len(e), q(0.5), q(0.9), q(0.99))
	}
	log.Printf("nqdelay: statistics end")
}
