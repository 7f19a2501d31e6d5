// Package kmsg is the node agent's kernel log source: it reads NVIDIA driver
// XID lines and NVSwitch SXid lines from /dev/kmsg and reports them as
// findings, keeping a cursor so that a restart does not replay old lines.
package kmsg
