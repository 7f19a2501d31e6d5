// Package pipeline turns the node agent's findings into NodeHealthEvents:
// normalize, classify (the shared default table; the operator's policy has
// the final word), debounce, coalesce into one object per node, source,
// check, component and code, and publish with create-or-patch, retries with
// backoff and a client-side rate limit, through an on-disk spool so that
// nothing is lost across a restart or an apiserver outage.
package pipeline
