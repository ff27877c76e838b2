package prom

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// query runs one instant query evaluated at time at (zero: Prometheus's now, no time parameter
// sent) and returns its vector. A query cut short because ctx is done (shutdown) is not counted.
func (s *Source) query(ctx context.Context, name, q string, at time.Time) (model.Vector, error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	v, warnings, _, err := s.api.Query(qctx, q, at, v1.WithTimeout(s.cfg.Timeout))
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err == nil {
		vec, ok := v.(model.Vector)
		switch {
		case !ok:
			typ := "none"
			if v != nil {
				typ = v.Type().String()
			}
			err = fmt.Errorf("result type %s, want vector", typ)
		case len(vec) > s.cfg.MaxSeries:
			err = fmt.Errorf("%d series, more than the cap of %d (--prometheus-max-series)", len(vec), s.cfg.MaxSeries)
		default:
			if len(warnings) > 0 {
				s.log.Warn("prom: Prometheus warned about a query", "query", name, "promql", q, "warnings", []string(warnings))
			}
			s.queries.WithLabelValues(name, "ok").Inc()
			return vec, nil
		}
	}
	s.queries.WithLabelValues(name, "error").Inc()
	var apiErr *v1.Error
	if errors.As(err, &apiErr) && strings.TrimSpace(apiErr.Detail) != "" { // the body of an HTTP error
		detail := strings.TrimSpace(apiErr.Detail)
		if len(detail) > maxDetail {
			detail = strings.ToValidUTF8(detail[:maxDetail], "") + "…"
		}
		err = fmt.Errorf("%w (response: %s)", err, detail)
	}
	return nil, fmt.Errorf("%w: %s query %q at %s: %w", ErrQuery, name, q, s.url, err)
}

// maxDetail bounds how much of an HTTP error's body goes into an error message.
const maxDetail = 200

// ErrResponseTooLarge is wrapped by the error of a response over Config.MaxResponseBytes.
var ErrResponseTooLarge = errors.New("prom: response too large")

// limitedTransport cuts every response body at max bytes: reading past it fails with
// ErrResponseTooLarge.
type limitedTransport struct {
	rt  http.RoundTripper
	max int64
}

func (l limitedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.rt.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitedBody{rc: resp.Body, left: l.max, max: l.max}
	return resp, nil
}

// CloseIdleConnections closes the wrapped transport's idle connections.
func (l limitedTransport) CloseIdleConnections() {
	if ci, ok := l.rt.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

type limitedBody struct {
	rc        io.ReadCloser
	left, max int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, err := b.rc.Read(one[:]); n > 0 {
			return 0, fmt.Errorf("%w: more than %d bytes (--prometheus-max-response-bytes)", ErrResponseTooLarge, b.max)
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
