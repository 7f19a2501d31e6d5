// Package eventgc garbage-collects finished NodeHealthEvents: those the
// operator judged Resolved, Superseded or Ignored go after a retention
// period, and each node keeps at most a cap of events, the oldest finished
// going first. Active findings are never deleted.
package eventgc
