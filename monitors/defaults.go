package monitors

import "time"

// PositiveOr returns d, or def when d is not positive: a source's interval
// or window left zero (or set negative) in its configuration takes the
// default.
func PositiveOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
