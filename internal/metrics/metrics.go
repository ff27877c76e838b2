// Package metrics turns a failure of promauto registering a metric into an error.
package metrics

import "fmt"

// Registered returns, for the value of recover() in a function that made metrics with
// promauto.With(reg), the registration that failed (a name registered twice, say) as an error
// prefixed with who registers; nil when nothing panicked. Any other panic goes on. Use it as
//
//	defer func() { err = metrics.Registered("who", recover()) }()
func Registered(who string, r any) error {
	if r == nil {
		return nil
	}
	e, ok := r.(error)
	if !ok {
		panic(r)
	}
	return fmt.Errorf("%s: registering metrics: %w", who, e)
}
