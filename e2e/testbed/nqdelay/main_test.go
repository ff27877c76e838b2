package main

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// ipv4 is the start of an IPv4 header from src to dst carrying protocol proto.
func ipv4(src, dst string, proto byte) []byte {
	h := make([]byte, 20)
	h[0], h[9] = 0x45, proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return h
}

// verdictIDs returns the packet ids of the verdicts batched in b, in order.
func verdictIDs(t *testing.T, b []byte) []uint32 {
	t.Helper()
	var ids []uint32
	for len(b) > 0 {
		n := int(binary.LittleEndian.Uint32(b))
		if n != 32 || len(b) < n {
			t.Fatalf("a verdict message of %d bytes (of %d left); want 32", n, len(b))
		}
		if v := binary.BigEndian.Uint32(b[24:]); v != nfAccept {
			t.Fatalf("verdict %d; want NF_ACCEPT", v)
		}
		ids = append(ids, binary.BigEndian.Uint32(b[28:]))
		b = b[n:]
	}
	return ids
}

// TestReleaseOrder: the loop's release releases each pair's packets in FIFO order, never
// before their one-way delay, every pair by its own delay, and at once the packets of pairs
// the matrix does not delay; a TCP packet of a pair with a TCP penalty waits its extra in a
// FIFO of its own, so the pair's ICMP does not queue behind it.
func TestReleaseOrder(t *testing.T) {
	a, b, c := "198.18.0.1", "198.18.0.2", "198.18.0.3"
	key := func(x, y string) pairKey { return pairKey{src: netip.MustParseAddr(x), dst: netip.MustParseAddr(y)} }
	d := &daemon{pairs: map[pairKey]*pairQueue{}, rng: rand.New(rand.NewPCG(1, 2)), matrix: map[pairKey]delaySpec{
		key(a, b): {oneWay: 5 * time.Millisecond, tcpExtra: 10 * time.Millisecond},
		key(a, c): {oneWay: 2 * time.Millisecond},
	}}
	const ms = int64(time.Millisecond)
	t0 := int64(1000) * ms
	d.handle(ipv4(a, b, 6), 1, t0)    // a→b TCP: due at +15
	d.handle(ipv4(a, b, 1), 2, t0)    // a→b ICMP: due at +5
	d.handle(ipv4(a, c, 6), 3, t0+ms) // a→c: due at +3
	d.handle(ipv4(b, c, 6), 4, t0+ms) // not delayed: at once
	d.handle(ipv4(a, c, 1), 5, t0+ms) // a→c: due at +3, after 3
	for _, step := range []struct {
		at   int64
		want []uint32
	}{
		{t0 + ms, []uint32{4}},
		{t0 + 3*ms - 1, nil},
		{t0 + 3*ms, []uint32{3, 5}},
		{t0 + 5*ms, []uint32{2}},
		{t0 + 14*ms, nil},
		{t0 + 15*ms, []uint32{1}},
	} {
		d.releaseDue(step.at)
		got := verdictIDs(t, d.verdicts)
		if len(got) != len(step.want) || len(got) > 0 && !slices.Equal(got, step.want) {
			t.Errorf("at +%v: verdicts for %v; want %v", time.Duration(step.at-t0), got, step.want)
		}
		d.verdicts, d.released, d.dues = d.verdicts[:0], d.released[:0], d.dues[:0]
	}
	if len(d.held) != 0 {
		t.Errorf("%d pairs still hold packets after every due time", len(d.held))
	}
	// FIFO: a packet queued behind a later one of its pair never leaves before it.
	d.matrix[key(a, c)] = delaySpec{oneWay: 20 * time.Millisecond}
	d.handle(ipv4(a, c, 6), 6, t0+20*ms) // due at +40
	d.matrix[key(a, c)] = delaySpec{oneWay: 2 * time.Millisecond}
	d.handle(ipv4(a, c, 6), 7, t0+21*ms) // alone due at +23, but behind 6
	d.releaseDue(t0 + 30*ms)
	if got := verdictIDs(t, d.verdicts); len(got) != 0 {
		t.Errorf("at +30 ms: verdicts for %v; want none (7 waits behind 6)", got)
	}
	d.releaseDue(t0 + 40*ms)
	if got := verdictIDs(t, d.verdicts); !slices.Equal(got, []uint32{6, 7}) {
		t.Errorf("at +40 ms: verdicts for %v; want [6 7]", got)
	}
}
