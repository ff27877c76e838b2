// Package metrics holds what every edgeflow component does with its Prometheus collectors.
package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers every collector with reg (nil: none is registered). It registers all it
// can and returns every failure (a name registered twice, say), prefixed with who registers.
func Register(who string, reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	var errs []error
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: registering metrics: %w", who, err)
	}
	return nil
}
