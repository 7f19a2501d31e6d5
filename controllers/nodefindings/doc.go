// Package nodefindings derives findings from what the cluster already shows
// about a node: the Node conditions a policy lists (node-problem-detector's,
// the kubelet's), the node's NVIDIA stack against its pool's majority
// (drift), and its GPU count against the expected one, as NVML and the
// scheduler see it. Each is a NodeHealthEvent the node workflow judges like
// a monitor's.
package nodefindings
