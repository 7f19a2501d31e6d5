// Package computedomain keeps a read-only view of NVIDIA ComputeDomains and
// their cliques, and taints the nodes of an NVLink clique that has a fabric
// fault.
package computedomain
