// Package dcgm is the monitor's DCGM source: it turns DCGM policy violations,
// NVLink error counters, IMEX status fields and health-watch incidents into
// findings, through a small Client interface that go-dcgm implements.
package dcgm
