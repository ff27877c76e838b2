package tpgen

import "testing"

// The reference values come from lemon_tp.cc's next_u64 compiled as C.
func TestSplitMix64(t *testing.T) {
	for _, tt := range []struct {
		seed uint64
		want [3]uint64
	}{
		{0, [3]uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}},
		{1, [3]uint64{0x910a2dec89025cc1, 0xbeeb8da1658eec67, 0xf893a2eefb32555e}},
	} {
		g := SplitMix64{State: tt.seed}
		for k, w := range tt.want {
			if got := g.Next(); got != w {
				t.Errorf("seed %d draw %d = %#x, want %#x", tt.seed, k, got, w)
			}
		}
	}
}

func TestDenseShape(t *testing.T) {
	for _, uniform := range []bool{false, true} {
		c, s, d := Dense(7, 4, 1, uniform, 1000)
		if len(c) != 28 || len(s) != 7 || len(d) != 4 {
			t.Fatalf("lengths %d %d %d", len(c), len(s), len(d))
		}
		var ss, sd int64
		for _, v := range s {
			ss += v
		}
		for _, v := range d {
			sd += v
		}
		if ss != sd {
			t.Errorf("uniform=%v: supply %d != demand %d", uniform, ss, sd)
		}
		if want := uint64(0x910a2dec89025cc1) % 1000; c[0] != 1+int64(want) {
			t.Errorf("cost[0] = %d, want %d", c[0], 1+want)
		}
	}
}
