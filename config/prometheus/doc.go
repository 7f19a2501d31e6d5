// Package prometheus holds no code: its tests parse the alert rules in
// rules.yaml with Prometheus's own rule loader and fire every alert against
// synthetic series, the way `promtool test rules` would.
package prometheus
