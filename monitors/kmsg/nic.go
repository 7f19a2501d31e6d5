package kmsg

import (
	"regexp"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// Codes of the NIC findings (KindNIC, Check NIC): what the mlx5 driver of a
// ConnectX adapter said about it. They are few on purpose: a code is a
// NodeHealthEvent's identity, so two lines of the same fault share one.
const (
	// NICHealthCompromised is an adapter that stopped working until it is
	// reset: its firmware stopped updating the health counter, the driver's
	// fatal sensors fired (internal error state), the driver's recovery
	// failed, or the firmware asks for a cold reset.
	NICHealthCompromised = "HealthCompromised"
	// NICHealthSyndrome is the syndrome the firmware wrote to its health
	// buffer (the cause of a HealthCompromised: firmware internal error,
	// irisc not responding, high temperature…).
	NICHealthSyndrome = "HealthSyndrome"
	// NICCommandTimeout is a firmware command that did not complete.
	NICCommandTimeout = "CommandTimeout"
	// NICFirmwareReset is the firmware being reset (by the driver's error
	// recovery, or a sync reset another function or a firmware update
	// started).
	NICFirmwareReset = "FirmwareReset"
	// NICModuleError is a cable or transceiver the firmware put in its
	// error state (too hot, bad or shorted, unsupported, over the power
	// budget…).
	NICModuleError = "ModuleError"
	// NICModuleUnplugged is a cable or transceiver pulled out of its cage.
	NICModuleUnplugged = "ModuleUnplugged"
	// NICTxTimeout is a transmit queue of the adapter's network interface
	// that stopped making progress.
	NICTxTimeout = "TxTimeout"
)

// The NIC table: kernel log lines of the mlx5 driver (NVIDIA/Mellanox
// ConnectX adapters), read from the driver's format strings, and what each
// means for a node. The kernel files and versions each row was read from are
// in testdata/mlx5/SOURCES.md.
//
// Every mlx5 line starts with the device prefix dev_err/netdev_err print:
// "mlx5_core 0000:c1:00.0: " (dev_printk: driver, PCI function) or
// "mlx5_core 0000:c1:00.0 ens1f0np0: " (netdev_printk: driver, PCI function,
// interface, and " (unregistered)" or the like while the interface is not
// registered). mlx5_core_err/mlx5_core_warn then add "<function>:<line>:(pid
// <n>): " ("<pci>:<function>:…" in 4.x kernels), mlx5_core_info and dev_err
// add nothing. The row patterns match what follows, anchored at both ends:
// a line the driver prints differently (a new wording in a later kernel) is
// not ours rather than misread.
//
// Deliberate omissions, each printed beside a row that is in the table:
//   - "cmd[%d]: %s(0x%x) No done completion" (cmd.c
//     wait_func_handle_exec_timeout): always followed by wait_func's
//     "…timeout. Will cause a leak of a command resource" for the same
//     command; counting both would count one timeout twice.
//   - "Health issue observed, %s, severity(%d) %s:" (health.c
//     print_health_info, newer kernels): the "synd 0x%x: %s" line it heads
//     names the same syndrome in every kernel version.
//   - "PCI slot is unavailable", "assert_var[%d] …", "rfr %d" and the other
//     health buffer lines: detail of the HealthCompromised line before them.
//   - "recovered after timeout", "Command completion arrived after timeout":
//     a command that did complete.
//   - "High temperature on sensors with bit set %#llx %#llx." (events.c
//     temp_warn): the adapter crossed its warning threshold, at which
//     NVIDIA's adapter manuals say the hardware takes no action; when it
//     reaches the shutdown threshold the firmware stops and the driver says
//     so (synd 0x10 "High temperature", health compromised).
//   - "Port module event: module %u, Cable disabled": the module's
//     administrative state, set by an operator or a tool.
//   - "Port module event: module %u, Cable plugged" and other informational
//     lines.
//
// Sub-functions (their device is "mlx5_core.sf.<n>", not a PCI function) are
// not read: a compute port is a physical function's.
type nicRow struct {
	code    string
	pattern *regexp.Regexp
}

var nicRows = []nicRow{
	// health.c poll_health: the firmware did not move the health counter
	// for three polls ("device's health compromised" alone before v4.x).
	{NICHealthCompromised, regexp.MustCompile(`^device's health compromised(?: - reached miss count)?$`)},
	// health.c poll_health: a fatal sensor fired (PCI reads fail, PCI
	// channel offline, NIC interface disabled or in SW reset, a firmware
	// syndrome with the recover-flow-request bit); the device enters the
	// internal error state and every command fails from now on.
	{NICHealthCompromised, regexp.MustCompile(`^Fatal error [0-9]+ detected$`)},
	// health.c mlx5_health_try_recover: the driver gave up on the adapter.
	{NICHealthCompromised, regexp.MustCompile(`^health recovery failed$`)},
	{NICHealthCompromised, regexp.MustCompile(`^health recovery flow aborted, PCI reads still not working$`)},
	// health.c print_health_info: the crr bit of the health buffer.
	{NICHealthCompromised, regexp.MustCompile(`^Cold reset is required$`)},
	// fw_reset.c: after a sync reset toggled the PCI link, the adapter did
	// not come back.
	{NICHealthCompromised, regexp.MustCompile(`^Firmware is not responsive \(0x[0-9a-f]+\) after [0-9]+ ms$`)},
	{NICHealthCompromised, regexp.MustCompile(`^PCI link not ready \(0x[0-9a-f]+\) after [0-9]+ ms$`)},
	{NICHealthCompromised, regexp.MustCompile(`^reset reload flow aborted, PCI reads still not working$`)},
	// health.c print_health_info: "synd 0x%x: %s" with hsynd_str's name.
	{NICHealthSyndrome, regexp.MustCompile(`^synd 0x[0-9a-f]+: [^\n]+$`)},
	// cmd.c wait_func, and cb_timeout_handler before it named the slot:
	// "%s(0x%x) timeout. Will cause a leak of a command resource". The
	// command name is mlx5_command_str's ("ACCESS_REG", or "unknown
	// command opcode").
	{NICCommandTimeout, regexp.MustCompile(`^[A-Za-z0-9_ ]+\(0x[0-9a-f]+\) timeout\. Will cause a leak of a command resource$`)},
	// cmd.c cb_timeout_handler: an asynchronous command timed out.
	{NICCommandTimeout, regexp.MustCompile(`^cmd\[[0-9]+\]: [A-Za-z0-9_ ]+\(0x[0-9a-f]+\) Async, timeout\. Will cause a leak of a command resource$`)},
	// cmd.c wait_func: the command waited for a free slot past the timeout.
	{NICCommandTimeout, regexp.MustCompile(`^[A-Za-z0-9_ ]+\(0x[0-9a-f]+\) canceled on out of queue timeout\.$`)},
	// health.c reset_fw_if_needed: the driver's error recovery resets the
	// firmware.
	{NICFirmwareReset, regexp.MustCompile(`^Issuing FW Reset$`)},
	// fw_reset.c poll_sync_reset: a sync reset (firmware activation,
	// devlink reload, or one another host of a multi-host adapter asked
	// for) is resetting the device now.
	{NICFirmwareReset, regexp.MustCompile(`^Got Device Reset$`)},
	// events.c port_module: "Port module event[error]: module %u, %s, %s"
	// (status "Cable error", then mlx5_pme_error_to_string's reason).
	{NICModuleError, regexp.MustCompile(`^Port module event\[error\]: module [0-9]+, [^,\n]+, [^\n]+$`)},
	// events.c port_module: "Port module event: module %u, %s".
	{NICModuleUnplugged, regexp.MustCompile(`^Port module event: module [0-9]+, Cable unplugged$`)},
	// en_main.c mlx5e_tx_timeout (netdev_err).
	{NICTxTimeout, regexp.MustCompile(`^TX timeout detected$`)},
	// en/reporter_tx.c mlx5e_reporter_tx_timeout (en_main.c before the
	// devlink reporter; ", usecs since last trans: %u" since then).
	{NICTxTimeout, regexp.MustCompile(`^TX timeout on queue: [0-9]+, SQ: 0x[0-9a-f]+, CQ: 0x[0-9a-f]+, SQ Cons: 0x[0-9a-f]+ SQ Prod: 0x[0-9a-f]+(?:, usecs since last trans: [0-9]+)?$`)},
	// net/sched/sch_generic.c dev_watchdog since v6.8 (netdev_crit, so it
	// carries the mlx5 device prefix).
	{NICTxTimeout, regexp.MustCompile(`^NETDEV WATCHDOG: CPU: [0-9]+: transmit queue [0-9]+ timed out [0-9]+ ms$`)},
}

// nicVerdict is how bad a NIC code is and why.
type nicVerdict struct {
	severity gpuhealthv1alpha1.Severity
	action   gpuhealthv1alpha1.Action
	why      string
}

// nicVerdicts judges each code. These are the severities for a NIC known to
// be the compute fabric; run.finding caps them at Degraded for any other.
var nicVerdicts = map[string]nicVerdict{
	NICHealthCompromised: {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode,
		"the adapter's firmware stopped or the driver put it in its internal error state: its ports carry nothing until it is reset, which on one host is a reboot"},
	NICHealthSyndrome: {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone,
		"the firmware's health buffer names a fault; the driver says whether it stopped the adapter (HealthCompromised), this line says why"},
	NICCommandTimeout: {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone,
		"a firmware command timed out; one can recover, a dead port is the ib source's to judge"},
	NICFirmwareReset: {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone,
		"the adapter's firmware is being reset and the driver reloads it; the link flaps this causes are the ib source's to judge"},
	NICModuleError: {gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRecertify,
		"the firmware put the cable or transceiver in its error state (too hot, bad or shorted, unsupported, over the power budget): the port has no link until the module cools or a person reseats or replaces it, which a reboot does not do; recertification proves the port once it is back"},
	NICModuleUnplugged: {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone,
		"a cable or transceiver was pulled out; the ib source judges the port going down"},
	NICTxTimeout: {gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone,
		"a transmit queue stalled and the driver recovers its channels; one stall logs several of these lines"},
}

// mlx5Prefix is the start of an mlx5 device line: the driver name, the PCI
// function (dev_name: "%04x:%02x:%02x.%d", a domain of up to 8 digits), an
// optional interface name and register state (netdev_printk), then ": ".
// An interface name is at most 15 characters (IFNAMSIZ); one with characters
// a component id may not hold is not read.
var mlx5Prefix = regexp.MustCompile(`^mlx5_core ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])` +
	`(?: \(unnamed net_device\)| ([A-Za-z0-9][A-Za-z0-9._-]{0,14}))?` +
	`(?: \((?:unregistering|unregistered|uninitialized)\))?: `)

// mlx5Location is what mlx5_core_err and mlx5_core_warn add after the device
// prefix: "poll_health:840:(pid 0): ", or with the device name first
// ("0000:41:00.0:poll_health:694:(pid 0): ") in 4.x kernels.
var mlx5Location = regexp.MustCompile(`^(?:[^\s()]*:)?[A-Za-z_][A-Za-z0-9_]*:[0-9]+:\(pid [0-9]+\): `)

// netdevWatchdog is dev_watchdog's text before v6.8, a WARN without a
// device prefix: "NETDEV WATCHDOG: eth1 (mlx5_core): transmit queue 19 timed
// out" (some kernels add " %u ms").
var netdevWatchdog = regexp.MustCompile(`^NETDEV WATCHDOG: ([A-Za-z0-9][A-Za-z0-9._-]{0,14}) \(mlx5_core\): transmit queue [0-9]+ timed out(?: [0-9]+ ms)?$`)

// parseNIC recognises an mlx5 line in a kernel message and fills a KindNIC
// entry. An mlx5 line the table does not know is not ours (ok false), not an
// error: the driver logs much more than faults.
func parseNIC(e Entry, msg string) (Entry, bool) {
	if m := netdevWatchdog.FindStringSubmatch(msg); m != nil {
		e.Kind, e.Netdev, e.NICCode, e.Text = KindNIC, m[1], NICTxTimeout, msg
		return e, true
	}
	loc := mlx5Prefix.FindStringSubmatchIndex(msg)
	if loc == nil {
		return e, false
	}
	bus, err := NormalizePCIBusID(msg[loc[2]:loc[3]])
	if err != nil {
		return e, false
	}
	var netdev string
	if loc[4] >= 0 {
		netdev = msg[loc[4]:loc[5]]
	}
	text := msg[loc[1]:]
	if l := mlx5Location.FindStringIndex(text); l != nil {
		text = text[l[1]:]
	}
	for _, r := range nicRows {
		if r.pattern.MatchString(text) {
			e.Kind, e.PCIBusID, e.Netdev, e.NICCode, e.Text = KindNIC, bus, netdev, r.code, text
			return e, true
		}
	}
	return e, false
}
