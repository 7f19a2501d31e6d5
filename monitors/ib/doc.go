// Package ib is the agent's ib source: the health of the node's compute
// network, its InfiniBand and RoCE ports, read from the kernel's RDMA sysfs
// tree (/sys/class/infiniband) each second. A port down or flapping breaks
// every multi-node job through it and is reported Fatal; a port below its
// expected rate, error counters rising faster than their thresholds and an
// adapter on the PCI bus without an RDMA device are Degraded. Which ports
// are the compute fabric is configuration (every InfiniBand port, plus the
// devices named), so a management NIC never quarantines a node.
//
// Nothing here talks to an adapter (no MAD queries, no mlxlink): what the
// driver already publishes in sysfs is read, which needs no privilege and
// costs well under a millisecond a scan for eight adapters.
package ib
