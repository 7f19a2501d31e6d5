package monitors

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// PositiveOr returns d, or def when d is not positive: a source's interval
// or window left zero (or set negative) in its configuration takes the
// default.
func PositiveOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Every calls fn every interval on clk until ctx is done: the scan loop of
// the sources that read the node at a fixed pace (services, ib). It returns
// when ctx is done; fn's first call is an interval after Every is called.
func Every(ctx context.Context, clk clock.WithTicker, interval time.Duration, fn func()) {
	ticker := clk.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
		fn()
	}
}
