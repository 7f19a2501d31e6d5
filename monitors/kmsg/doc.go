// Package kmsg is the node agent's kernel log source: it reads NVIDIA driver
// XID lines, NVSwitch SXid lines and the mlx5 driver's faults of ConnectX
// network adapters from /dev/kmsg and reports them as findings, keeping a
// cursor so that a restart does not replay old lines.
//
// # NIC lines
//
// The mlx5 driver (NVIDIA/Mellanox ConnectX) logs faults of an adapter that
// the RDMA sysfs tree the ib source reads does not show: a firmware that
// stopped answering keeps its ports ACTIVE and LinkUp for a while. The NIC
// table (nic.go) lists the lines that matter, each read from the driver's
// format string (health.c, cmd.c, events.c, fw_reset.c, en_main.c,
// en/reporter_tx.c, and the core's NETDEV WATCHDOG text), and gives each a
// code: HealthCompromised (the health counter stopped, the driver's fatal
// sensors fired, recovery failed, a cold reset is required: Fatal,
// RebootNode), HealthSyndrome (the firmware's syndrome, the cause),
// CommandTimeout, FirmwareReset, ModuleUnplugged and TxTimeout (Degraded,
// None) and ModuleError (a cable or transceiver in its error state: Fatal,
// Recertify). testdata/mlx5 holds real lines from public reports and lines
// built from the format strings for the rest, with SOURCES.md saying which
// is which and which kernel trees the format strings were read from.
//
// Limits: the patterns match the wording of the kernels they were read from
// (v3.x to the v7.0 cycle), anchored at both ends; a wording a later kernel
// changes is not ours (KindNone) until the table learns it. Lines of other
// NIC drivers, of mlx5 sub-functions and of the out-of-tree MLNX_OFED driver
// where it words a line differently are not read. The driver logs one fault
// in several lines (a TX stall: the watchdog, "TX timeout detected" and one
// line per stalled queue), so a finding's count is of lines, not faults.
// Which adapter is the compute fabric is not this package's call: the
// agent wires Source.NICResolver to the ib source, and without it no NIC
// line is worse than Degraded.
package kmsg
