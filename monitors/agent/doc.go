// Package agent runs the node agent's sources next to its pipeline: it
// starts each configured source, tells apart a source that cannot run on
// this node from one that died, and exposes that as metrics and as the
// agent's health check.
package agent
