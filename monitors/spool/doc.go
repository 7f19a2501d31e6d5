// Package spool keeps the node agent's findings that the apiserver has not
// acknowledged yet in a bounded directory on the node (a hostPath), so that
// a restart of the agent or an apiserver outage loses none of them.
package spool
