// Package member releases a dead node's ComputeDomain membership by deleting
// its stale daemon pod objects.
package member
