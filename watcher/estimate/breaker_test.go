package estimate

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestBreaker runs one service through sequences of good (g: 10 ms measured against 10 ms
// predicted) and bad (b: 20 ms, relative error 1) windows, and missing ones (-), with K = 3 and
// M = 4, and checks Tripped after each window.
func TestBreaker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		windows string
		tripped string // after each window: T tripped, . not
	}{
		{"trips after K bad", "gbbb", "...T"},
		{"K−1 bad then good: no trip", "bbgbbgbb", "........"},
		{"missing windows neither count nor reset", "bb-b", "..-T"},
		{"resets after M good", "bbbgggg", "..TTTT."},
		{"a bad window restarts the good streak", "bbbgggbgggg", "..TTTTTTTT."},
		{"missing windows while tripped", "bbbgg--gg", "..TTT--T."},
		{"trips again", "bbbggggbbb", "..TTTT...T"},
		{"faster than predicted is not bad", "fffff", "....."},
		{"faster than predicted resets", "bbbffff", "..TTTT."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBreaker(BreakerConfig{Threshold: 0.5, TripAfter: 3, ResetAfter: 4})
			if err != nil {
				t.Fatal(err)
			}
			var got strings.Builder
			for _, w := range tc.windows {
				var window []ResponseTime
				switch w {
				case 'g':
					window = []ResponseTime{{Service: "a", PredictedMS: 10, MeasuredMS: 10}}
				case 'b':
					window = []ResponseTime{{Service: "a", PredictedMS: 10, MeasuredMS: 20}}
				case 'f': // the model over-predicts by as much: conservative, not a failure
					window = []ResponseTime{{Service: "a", PredictedMS: 20, MeasuredMS: 5}}
				}
				before := b.State("a").Tripped
				changed, err := b.Observe(window)
				if err != nil {
					t.Fatal(err)
				}
				st := b.State("a")
				if flipped := st.Tripped != before; flipped != (len(changed) == 1) {
					t.Errorf("window %d: Tripped %v → %v, but Observe reported %v", got.Len(), before, st.Tripped, changed)
				}
				switch {
				case w == '-':
					got.WriteByte('-')
				case st.Tripped:
					got.WriteByte('T')
				default:
					got.WriteByte('.')
				}
			}
			if got.String() != tc.tripped {
				t.Errorf("windows %s: tripped %s, want %s", tc.windows, got.String(), tc.tripped)
			}
		})
	}
}

func TestBreakerState(t *testing.T) {
	b, err := NewBreaker(BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := b.Observe([]ResponseTime{
			{Service: "b", PredictedMS: 8, MeasuredMS: 4},     // under by half: at the threshold, good
			{Service: "a", PredictedMS: 8, MeasuredMS: 12.4},  // over by 0.55: bad
			{Service: "c", PredictedMS: 1.1, MeasuredMS: 2},   // over by 0.82 but 0.9 ms: good (MinErrorMS)
			{Service: "d", PredictedMS: 1.1, MeasuredMS: 2.2}, // over by 1 and 1.1 ms: bad
		}); err != nil {
			t.Fatal(err)
		}
	}
	want := []BreakerState{
		{Service: "a", Tripped: true, BadWindows: 3, RelativeError: 0.55, Reason: "measured response time 12.4 ms " +
			"against 8 ms predicted (relative error 0.55 > 0.50) for 3 consecutive windows: falling back to lata"},
		{Service: "b", GoodWindows: 3, RelativeError: 0.5},
		{Service: "c", GoodWindows: 3, RelativeError: 0.9 / 1.1},
		{Service: "d", Tripped: true, BadWindows: 3, RelativeError: 1, Reason: "measured response time 2.2 ms " +
			"against 1.1 ms predicted (relative error 1.00 > 0.50) for 3 consecutive windows: falling back to lata"},
	}
	if d := cmp.Diff(want, b.States(), approx); d != "" {
		t.Errorf("states (-want +got):\n%s", d)
	}
	if d := cmp.Diff(BreakerState{Service: "z"}, b.State("z")); d != "" {
		t.Errorf("unseen service (-want +got):\n%s", d)
	}
}

func TestBreakerInvalid(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bad    ResponseTime
		naming string
	}{
		{"empty service", ResponseTime{PredictedMS: 1}, "empty service"},
		{"zero prediction", ResponseTime{Service: "x", MeasuredMS: 1}, `service "x": predicted response time 0 ms`},
		{"NaN prediction", ResponseTime{Service: "x", PredictedMS: math.NaN()}, `service "x": predicted response time NaN ms`},
		{"negative measurement", ResponseTime{Service: "x", PredictedMS: 1, MeasuredMS: -1}, `service "x": measured response time -1 ms`},
		{"infinite measurement", ResponseTime{Service: "x", PredictedMS: 1, MeasuredMS: math.Inf(1)}, `service "x": measured response time +Inf ms`},
		{"twice", ResponseTime{Service: "a", PredictedMS: 1, MeasuredMS: 100}, `service "a": given twice in one window`},
		{"negative requests", ResponseTime{Service: "x", PredictedMS: 1, MeasuredMS: 1, Requests: -1}, `service "x": -1 requests`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBreaker(BreakerConfig{TripAfter: 1})
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.Observe([]ResponseTime{{Service: "a", PredictedMS: 10, MeasuredMS: 10}, tc.bad})
			if !errors.Is(err, ErrInvalidSample) || !strings.Contains(err.Error(), tc.naming) {
				t.Fatalf("error %v, want ErrInvalidSample saying %q", err, tc.naming)
			}
			// The valid entry was taken, the invalid one skipped (TripAfter 1 would trip on it).
			for _, st := range b.States() {
				if st.Tripped || (st.Service == "a" && st.GoodWindows != 1) {
					t.Errorf("state %+v: want a with one good window, nothing tripped", st)
				}
			}
		})
	}
	for _, cfg := range []BreakerConfig{{Threshold: -1}, {Threshold: math.Inf(1)}, {TripAfter: -1}, {ResetAfter: -2}, {MinRequests: -1}, {MinRequests: math.NaN()}} {
		if _, err := NewBreaker(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewBreaker(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestBreakerMinRequests: a window under the sample floor is no measurement: it neither counts
// toward a trip nor breaks a bad streak.
func TestBreakerMinRequests(t *testing.T) {
	b, err := NewBreaker(BreakerConfig{TripAfter: 2, MinRequests: 50})
	if err != nil {
		t.Fatal(err)
	}
	bad := func(n float64) []ResponseTime {
		return []ResponseTime{{Service: "a", PredictedMS: 10, MeasuredMS: 30, Requests: n}}
	}
	for i, n := range []float64{50, 49, 0, 200} {
		if _, err := b.Observe(bad(n)); err != nil {
			t.Fatal(err)
		}
		st := b.State("a")
		if want := i == 3; st.Tripped != want {
			t.Errorf("window %d (%v requests): tripped %v, want %v (%+v)", i, n, st.Tripped, want, st)
		}
		if i == 2 && st.BadWindows != 1 {
			t.Errorf("after two thin windows: %d bad windows, want 1 (thin windows pass over)", st.BadWindows)
		}
	}
}
