package kmsg

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
)

// Kind says what a parsed kernel log record is about.
type Kind string

const (
	// KindNone is a record that is not ours: any kernel line other than an
	// NVIDIA XID, an NVSwitch SXid headline or an mlx5 line of the NIC
	// table, a dictionary continuation line, an empty line, or any record a
	// process wrote (see Parse).
	KindNone Kind = ""
	// KindXID is an NVIDIA driver XID line ("NVRM: Xid (PCI:…): 79, …").
	KindXID Kind = "XID"
	// KindSXID is an NVSwitch SXid headline
	// ("nvidia-nvswitch3: SXid (PCI:…): 20034, Fatal, …").
	KindSXID Kind = "SXID"
	// KindGPULost is the driver's text for a GPU that fell off the bus,
	// printed without an XID ("NVRM: GPU 0000:b3:00.0: GPU has fallen off
	// the bus." or "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5)
	// installed in this system has fallen off the bus and is not
	// responding to commands.").
	KindGPULost Kind = "GPULost"
	// KindNIC is a fault the mlx5 driver logged about an NVIDIA/Mellanox
	// ConnectX adapter, one of the lines of the NIC table (nic.go): for
	// example "mlx5_core 0000:c1:00.0: poll_health:840:(pid 0): device's
	// health compromised - reached miss count".
	KindNIC Kind = "NIC"
)

// Limits on the numbers a well-formed line carries. The XID catalog ends in
// the 170s; a number up to five digits is an XID a newer driver may print
// (reported as an unknown XID). SXids have five digits (for example 20034).
// Anything longer is a line we misread.
const (
	maxXID  = xid.MaxCode
	maxSXID = 99999
)

// ErrMalformed marks a record that looks like ours (it has the XID or SXid
// marker, or it is a record at all) but cannot be read: a bad record prefix, a
// missing or non-numeric code, a code out of range, a bad PCI address.
var ErrMalformed = errors.New("malformed kernel log record")

// Entry is one parsed /dev/kmsg record.
type Entry struct {
	// Seq is the record's sequence number, unique and increasing within one
	// boot. It is set whenever the record prefix was readable.
	Seq uint64
	// Userspace is true for a record whose syslog facility is not the
	// kernel's: a process wrote it to /dev/kmsg. Such a record is never ours
	// (its Kind is KindNone), whatever its message says. It is set whenever
	// the record prefix was readable.
	Userspace bool
	// Timestamp is when the kernel logged the record, as time since boot
	// (the kernel's monotonic clock, microsecond resolution).
	Timestamp time.Duration
	// Kind is what the record is about; KindNone means "not ours" and leaves
	// the fields below empty.
	Kind Kind
	// PCIBusID is the GPU's (XID), NVSwitch's (SXid) or network adapter
	// function's (NIC) PCI address in the canonical form NormalizePCIBusID
	// returns, for example "0000:3b:00.0". A NIC line that names only an
	// interface (the NETDEV WATCHDOG text before v6.8) leaves it empty.
	PCIBusID string
	// Netdev is the network interface a NIC line names ("ens1f0np0"): the
	// interface of a netdev_err line, or the one the transmit watchdog
	// names; empty when the line names none.
	Netdev string
	// NICCode is a NIC line's code: one of the NIC* constants, for example
	// NICHealthCompromised. Empty for other kinds.
	NICCode string
	// Code is the XID or SXid number.
	Code int
	// GPUInstance and ComputeInstance are the MIG GPU instance ("GPU-I:01")
	// and compute instance ("GPU-CI:02") an XID line names, or -1.
	GPUInstance, ComputeInstance int
	// Flag is an SXid's severity token as printed: "Fatal", "Non-fatal",
	// "Correctable", or "" for a headline without one (such as "SOE HALTED").
	Flag string
	// Fatal is true for an SXid the driver marked "Fatal"; always false for
	// XIDs, whose severity the pipeline looks up in api/xid.
	Fatal bool
	// Link is the NVSwitch port an SXid names ("Link 30 …"), or -1 when the
	// line names none. Always -1 for XIDs.
	Link int
	// Text is everything after the code (after the flag for an SXid), for
	// example "pid=1234, name=python, GPU has fallen off the bus.", or the
	// driver's whole message for KindGPULost. XID 154's recovery action and
	// the NVLink5 registers are decoded from it. For a NIC line it is the
	// driver's text after the device prefix and the function location
	// ("device's health compromised - reached miss count"), or the whole
	// message of the NETDEV WATCHDOG text.
	Text string
}

// empty returns an entry that is not ours, with the record's prefix fields.
func empty(seq uint64, ts time.Duration) Entry {
	return Entry{Seq: seq, Timestamp: ts, Link: -1, GPUInstance: -1, ComputeInstance: -1}
}

// Parse reads one /dev/kmsg record: "<priority>,<seq>,<timestamp_us>,<flags>[,…];<message>".
// Only the first line counts: the dictionary lines that follow it (and that
// start with a space, such as " SUBSYSTEM=pci") are ignored, and a
// continuation line on its own is not ours.
//
// Only the kernel's own records count. Any process that may open /dev/kmsg
// for writing (root, or a privileged container) can add a record with any
// text, but the kernel stamps every such record with a syslog facility other
// than 0: LOG_USER when the writer names none, and it turns a requested
// facility 0 into LOG_USER too (devkmsg_write in kernel/printk/printk.c). So
// a record whose facility is not 0 (LOG_KERN) is KindNone with Userspace
// set, and its message is not read at all.
//
// The driver's lines start the message: "NVRM: Xid (…", "NVRM: GPU …",
// "NVRM: The NVIDIA GPU …", and for an NVSwitch "nvidia-nvswitch3: SXid (…"
// (the device name is optional here). A marker anywhere else in a message
// is text some other kernel code quoted (a file name, a command line) and is
// not ours. The same holds for the mlx5 driver's lines ("mlx5_core
// 0000:c1:00.0: …", or the transmit watchdog's "NETDEV WATCHDOG: eth1
// (mlx5_core): …"): those of the NIC table (nic.go) are KindNIC, every
// other mlx5 line is KindNone with a nil error, however it looks.
//
// A record whose message is neither an NVRM XID line, the driver's GPU-lost
// text nor an NVSwitch SXid headline returns KindNone and a nil error. SXid
// detail lines (the "Severity …", "Data {…}" and "SOE HALT data[…]" lines the
// driver prints after a headline) repeat the headline's SXid and are not
// ours either. A record that cannot be read returns an error wrapping
// ErrMalformed; the Seq and Timestamp of the returned Entry are still set
// when its prefix was readable. The GPU-lost text that arrives split over
// several records is joined by a Joiner before Parse.
func Parse(record string) (Entry, error) {
	line, _, _ := strings.Cut(record, "\n")
	if strings.TrimSpace(line) == "" || line[0] == ' ' || line[0] == '\t' {
		return empty(0, 0), nil
	}
	h, msg, err := parseHeader(line)
	if err != nil {
		return empty(0, 0), err
	}
	e := empty(h.seq, h.timestamp)
	if h.facility != kernelFacility {
		e.Userspace = true
		return e, nil
	}
	msg = unescape(strings.TrimRight(msg, "\r"))
	if bus, text, ok := gpuLost(msg); ok {
		e.Kind, e.PCIBusID, e.Text, e.Code = KindGPULost, bus, text, 79
		return e, nil
	}
	if rest, ok := strings.CutPrefix(msg, xidMarker); ok {
		return parseXID(e, rest)
	}
	if rest, ok := cutSXidHeadline(msg); ok {
		return parseSXid(e, rest)
	}
	if nic, ok := parseNIC(e, msg); ok {
		return nic, nil
	}
	return e, nil
}

// kernelFacility is the syslog facility (LOG_KERN) of the records the kernel
// itself logs; no process can write a record with it.
const kernelFacility = 0

// sxidHeadline is the start of an NVSwitch line: the driver's device name
// ("nvidia-nvswitch3: ", printed by nvswitch_os_print), then the marker.
var sxidHeadline = regexp.MustCompile(`^(?:nvidia-nvswitch[0-9]{1,4}: )?SXid`)

// cutSXidHeadline returns what follows the marker of a message that starts
// like an SXid line (the optional device name, "SXid", optional spaces, then
// the parenthesised address).
func cutSXidHeadline(msg string) (string, bool) {
	loc := sxidHeadline.FindStringIndex(msg)
	if loc == nil {
		return "", false
	}
	rest := msg[loc[1]:]
	if !strings.HasPrefix(strings.TrimLeft(rest, " "), "(") {
		return "", false
	}
	return rest, true
}

// xidMarker starts every XID line the NVIDIA driver prints.
const xidMarker = "NVRM: Xid"

// header is a record's prefix.
type header struct {
	// facility is the syslog facility: 0 (LOG_KERN) for the kernel's own
	// records.
	facility  uint64
	seq       uint64
	timestamp time.Duration
}

// parseHeader splits a record into its prefix and message. The kernel
// documents the prefix in Documentation/ABI/testing/dev-kmsg: comma-separated
// priority (syslog facility*8 + level), sequence number, timestamp in
// microseconds since boot, and flags, possibly followed by more fields.
func parseHeader(line string) (header, string, error) {
	prefix, msg, ok := strings.Cut(line, ";")
	if !ok {
		return header{}, "", fmt.Errorf("%w: no ';' after the record prefix", ErrMalformed)
	}
	fields := strings.Split(prefix, ",")
	if len(fields) < 3 {
		return header{}, "", fmt.Errorf("%w: record prefix %q has fewer than 3 fields", ErrMalformed, excerpt(prefix))
	}
	prio, err := strconv.ParseUint(fields[0], 10, 16)
	if err != nil {
		return header{}, "", fmt.Errorf("%w: record priority %q is not a number", ErrMalformed, excerpt(fields[0]))
	}
	seq, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return header{}, "", fmt.Errorf("%w: record sequence %q is not a number", ErrMalformed, excerpt(fields[1]))
	}
	us, err := strconv.ParseUint(fields[2], 10, 63)
	if err != nil || us > uint64(maxTimestamp/time.Microsecond) {
		return header{}, "", fmt.Errorf("%w: record timestamp %q is not a number of microseconds", ErrMalformed, excerpt(fields[2]))
	}
	return header{facility: prio >> 3, seq: seq, timestamp: time.Duration(us) * time.Microsecond}, msg, nil
}

// maxTimestamp is the longest uptime a record may claim, so that the
// conversion to a Duration cannot overflow: a century.
const maxTimestamp = 100 * 365 * 24 * time.Hour

// parseXID reads what follows "NVRM: Xid": " (PCI:0000:3b:00): 79, text",
// or with MIG attribution " (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, text"
// (the driver's XID_PRINT_WITH_ATTR formats).
func parseXID(e Entry, rest string) (Entry, error) {
	a, code, text, err := parseAddressAndCode(rest, maxXID)
	if err != nil {
		return e, fmt.Errorf("%w: XID line: %w", ErrMalformed, err)
	}
	e.Kind, e.PCIBusID, e.Code, e.Text = KindXID, a.bus, code, text
	e.GPUInstance, e.ComputeInstance = a.gi, a.ci
	return e, nil
}

// sxidFlags are the severity tokens an SXid line may start with, and the
// flag each means: the driver's formats print Fatal, Non-fatal and
// Correctable; "Nonfatal" and "Non fatal" appear in hand-written logs.
var sxidFlags = []struct{ token, flag string }{
	{"Fatal", "Fatal"}, {"Non-fatal", "Non-fatal"}, {"Correctable", "Correctable"},
	{"Nonfatal", "Non-fatal"}, {"Non fatal", "Non-fatal"},
}

// parseSXid reads what follows "SXid":
// " (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up". The driver
// prints a headline with a severity token (Fatal, Non-fatal, Correctable)
// or without one (26006 "SOE HALTED"), and after a hardware error's headline
// detail lines that repeat its code ("Severity 1 Engine instance 30
// Sub-engine instance 00", "Data {0x…, …}", "SOE HALT data[0] = …"), which
// are not ours.
func parseSXid(e Entry, rest string) (Entry, error) {
	a, code, text, err := parseAddressAndCode(rest, maxSXID)
	if err != nil {
		return e, fmt.Errorf("%w: SXid line: %w", ErrMalformed, err)
	}
	if a.gi >= 0 || a.ci >= 0 {
		return e, fmt.Errorf("%w: SXid line: MIG attribution on an NVSwitch", ErrMalformed)
	}
	if isSXidDetail(text) {
		return empty(e.Seq, e.Timestamp), nil
	}
	e.Kind, e.PCIBusID, e.Code = KindSXID, a.bus, code
	e.Text = text
	for _, f := range sxidFlags {
		if rest, ok := cutWord(text, f.token); ok {
			e.Flag, e.Text = f.flag, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest), ","))
			break
		}
	}
	e.Fatal = e.Flag == "Fatal"
	e.Link = linkOf(e.Text)
	return e, nil
}

// cutWord returns s after word when s starts with it (any case) followed
// by the end, a comma or a space.
func cutWord(s, word string) (string, bool) {
	if len(s) < len(word) || !strings.EqualFold(s[:len(word)], word) {
		return "", false
	}
	rest := s[len(word):]
	if rest != "" && rest[0] != ',' && rest[0] != ' ' {
		return "", false
	}
	return rest, true
}

// isSXidDetail says whether an SXid line's text is one of the detail lines
// the driver prints after a headline.
func isSXidDetail(text string) bool {
	switch {
	case strings.HasPrefix(text, "Severity ") && strings.Contains(text, "Engine instance"):
		return true
	case strings.HasPrefix(text, "Data {"):
		return true
	case strings.HasPrefix(text, "SOE HALT data["):
		return true
	}
	return false
}

// address is the parenthesised part of an XID or SXid line.
type address struct {
	bus    string
	gi, ci int
}

// parseAddress reads "PCI:0000:3b:00[ GPU-I:01[ GPU-CI:02]]".
func parseAddress(s string) (address, error) {
	a := address{gi: -1, ci: -1}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return a, errors.New("empty PCI address")
	}
	bus, err := NormalizePCIBusID(fields[0])
	if err != nil {
		return a, err
	}
	a.bus = bus
	for _, f := range fields[1:] {
		name, val, ok := strings.Cut(f, ":")
		n, err := strconv.ParseUint(val, 10, 8)
		switch {
		case !ok || err != nil:
			return a, fmt.Errorf("MIG attribute %q is not NAME:number", excerpt(f))
		case name == "GPU-I" && a.gi < 0 && a.ci < 0:
			a.gi = int(n)
		case name == "GPU-CI" && a.gi >= 0 && a.ci < 0:
			a.ci = int(n)
		default:
			return a, fmt.Errorf("unexpected MIG attribute %q", excerpt(f))
		}
	}
	return a, nil
}

// parseAddressAndCode reads " (<address>): <code>[, <text>]" and returns the
// address, the code and the text.
func parseAddressAndCode(rest string, maxCode int) (address, int, string, error) {
	fail := func(err error) (address, int, string, error) { return address{gi: -1, ci: -1}, 0, "", err }
	rest = strings.TrimLeft(rest, " ")
	if !strings.HasPrefix(rest, "(") {
		return fail(errors.New("no '(' before the PCI address"))
	}
	addr, after, ok := strings.Cut(rest[1:], ")")
	if !ok {
		return fail(errors.New("no ')' after the PCI address"))
	}
	a, err := parseAddress(addr)
	if err != nil {
		return fail(err)
	}
	after, ok = strings.CutPrefix(after, ":")
	if !ok {
		return fail(errors.New("no ':' after the PCI address"))
	}
	after = strings.TrimLeft(after, " ")
	n := 0
	for n < len(after) && after[n] >= '0' && after[n] <= '9' {
		n++
	}
	if n == 0 {
		return fail(fmt.Errorf("code %q is not a number", excerpt(after)))
	}
	// More digits than the limit has cannot be in range; stop before Atoi
	// so that a huge number is an out-of-range error, not an overflow.
	if n > len(strconv.Itoa(maxCode)) {
		return fail(fmt.Errorf("code %s is over %d", excerpt(after[:n]), maxCode))
	}
	code, _ := strconv.Atoi(after[:n])
	if code > maxCode {
		return fail(fmt.Errorf("code %d is over %d", code, maxCode))
	}
	text := after[n:]
	switch {
	case strings.TrimSpace(text) == "":
		text = ""
	case text[0] == ',':
		text = strings.TrimSpace(text[1:])
	case text[0] == ' ' && strings.Contains(strings.TrimSpace(text), "="):
		// "79 Recommended Action=CONTACT_SUPPORT": text after a space.
		text = strings.TrimSpace(text)
	default:
		return fail(fmt.Errorf("code %q is not a number", excerpt(after)))
	}
	return a, code, text, nil
}

// linkOf returns the port number in an SXid text that starts with
// "Link <n>", or -1.
func linkOf(text string) int {
	rest, ok := strings.CutPrefix(text, "Link ")
	if !ok {
		return -1
	}
	n := 0
	for n < len(rest) && n < 4 && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || (n < len(rest) && rest[n] >= '0' && rest[n] <= '9') {
		return -1
	}
	l, _ := strconv.Atoi(rest[:n])
	return l
}

// NormalizePCIBusID returns a PCI address in the canonical form this package
// reports, "dddd:bb:dd.f" in lowercase hex (for example "0000:3b:00.0"). It
// accepts the forms the driver and NVML print: an optional "PCI:" prefix,
// a domain of up to 8 hex digits or none (domain 0), and an optional function
// (function 0): "PCI:0000:3b:00", "0000:3b:00", "3b:00.0",
// "00000000:3B:00.0". Use it on both sides of a resolver, so that the NVML
// bus id and the kernel's compare equal.
func NormalizePCIBusID(s string) (string, error) {
	orig := s
	s = strings.TrimSpace(s)
	if len(s) >= 4 && strings.EqualFold(s[:4], "PCI:") {
		s = s[4:]
	}
	parts := strings.Split(s, ":")
	var domainStr, busStr, slot string
	switch len(parts) {
	case 2:
		domainStr, busStr, slot = "0", parts[0], parts[1]
	case 3:
		domainStr, busStr, slot = parts[0], parts[1], parts[2]
	default:
		return "", fmt.Errorf("PCI address %q is not [domain:]bus:device[.function]", excerpt(orig))
	}
	devStr, fnStr, hasFn := strings.Cut(slot, ".")
	if !hasFn {
		fnStr = "0"
	}
	domain, err1 := parseHex(domainStr, 8, 0xffffffff)
	bus, err2 := parseHex(busStr, 2, 0xff)
	dev, err3 := parseHex(devStr, 2, 0x1f)
	fn, err4 := parseHex(fnStr, 1, 0x7)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return "", fmt.Errorf("PCI address %q is not [domain:]bus:device[.function]", excerpt(orig))
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn), nil
}

// parseHex reads 1 to maxDigits hex digits with a value of at most maxValue.
func parseHex(s string, maxDigits int, maxValue uint64) (uint64, error) {
	if s == "" || len(s) > maxDigits {
		return 0, errors.New("bad hex field")
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil || v > maxValue {
		return 0, errors.New("bad hex field")
	}
	return v, nil
}

// excerpt shortens text quoted in errors, so that a garbage line cannot
// make a huge error message or log entry; "…" marks a cut, which never
// splits a rune.
func excerpt(s string) string {
	const limit = 64
	if t := gpuhealthv1alpha1.Truncate(s, limit); t != s {
		return t + "…"
	}
	return s
}
