package ib

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The kernel's RDMA sysfs tree (Documentation/ABI/stable/sysfs-class-infiniband):
// /sys/class/infiniband/<device>/ holds the adapter's attributes (hca_type,
// fw_ver, a device link to its PCI function) and ports/<n>/ each
// port's. The port attributes read here:
//
//	state       "4: ACTIVE"        logical state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER
//	phys_state  "5: LinkUp"        physical state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test
//	rate        "400 Gb/sec (4X NDR)"
//	link_layer  "InfiniBand" or "Ethernet" (RoCE)
//	counters/<name>     the IB port counters (PortCounters and their extended form)
//	hw_counters/<name>  the driver's own counters (mlx5: out_of_sequence, local_ack_timeout_err, …)
//
// and for a RoCE port the network interface under device/net/<ifname>/:
// operstate ("up") and carrier_changes.
const (
	classDir = "class/infiniband"
	portsDir = "ports"
)

// Port states as the state file's number gives them.
const (
	stateActive = 4
	// physLinkUp is phys_state's LinkUp.
	physLinkUp = 5
)

// Link layers as link_layer prints them.
const (
	LinkLayerInfiniBand = "InfiniBand"
	LinkLayerEthernet   = "Ethernet"
)

// Port is one port of an RDMA device as one scan read it.
type Port struct {
	// Device is the RDMA device's name (mlx5_0); Num the port number (1).
	Device string
	Num    int
	// LinkLayer is InfiniBand or Ethernet.
	LinkLayer string
	// State and PhysState are the numbers of the state and phys_state
	// files, StateText and PhysText their names (ACTIVE, LinkUp).
	State, PhysState    int
	StateText, PhysText string
	// RateGbps is the link's rate in Gb/s (0 when unreadable), RateText as
	// the kernel prints it.
	RateGbps float64
	RateText string
	// Netdev is a RoCE port's network interface ("" when none), NetdevUp
	// whether its operstate is up, CarrierChanges its carrier_changes
	// counter (HasCarrier false when unreadable).
	Netdev         string
	NetdevUp       bool
	CarrierChanges uint64
	HasCarrier     bool
	// Counters are the counters read, by file name; a counter the driver
	// does not implement (the file is missing or its read fails, as IB
	// counters do on some RoCE ports) is absent.
	Counters map[string]uint64
}

// Up reports whether the port carries traffic: ACTIVE and LinkUp, and for a
// RoCE port whose interface is known, the interface up.
func (p *Port) Up() bool {
	if p.State != stateActive || p.PhysState != physLinkUp {
		return false
	}
	return p.Netdev == "" || p.NetdevUp
}

// ID is the port's component id, "<device>/<port>".
func (p *Port) ID() string { return p.Device + "/" + strconv.Itoa(p.Num) }

// Device is one RDMA device (an HCA, or one function of a multi-port
// adapter) as one scan read it.
type Device struct {
	// Name is the device's name (mlx5_0).
	Name string
	// PCI is its PCI function's address (0000:c1:00.0), "" when the device
	// link is not a PCI device.
	PCI string
	// HCAType and FirmwareVersion are hca_type (MT4129) and fw_ver.
	HCAType, FirmwareVersion string
	// Physical is true for a PCI physical function: not an SR-IOV virtual
	// function (its PCI device has a physfn link) nor a sub-function or
	// other non-PCI device.
	Physical bool
	// Ports are its ports in port order.
	Ports []Port
}

// reader reads sysfs attributes into one buffer: a scan each second of 8
// adapters reads a few dozen small files, and none of them needs more than
// a few dozen bytes. What does not change while an RDMA device exists (its
// PCI function, type, firmware, ports and their link layers: a firmware
// update or a mode change resets the adapter, which removes and re-adds the
// device) is read once per device and kept until a scan no longer lists it.
type reader struct {
	buf    [128]byte
	static map[string]*staticDevice
}

// staticDevice is what reader keeps of a device between scans.
type staticDevice struct {
	Device
	// ports are the port numbers and their link layers.
	ports []staticPort
}

type staticPort struct {
	num       int
	linkLayer string
}

// word reads a small attribute, trimmed.
func (r *reader) word(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	n, err := io.ReadFull(f, r.buf[:])
	_ = f.Close()
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", err
	}
	return strings.TrimSpace(string(r.buf[:n])), nil
}

// uint reads a counter attribute.
func (r *reader) uint(path string) (uint64, error) {
	s, err := r.word(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

// numbered parses "4: ACTIVE" into 4 and "ACTIVE".
func numbered(s string) (int, string, error) {
	num, name, ok := strings.Cut(s, ":")
	if !ok {
		return 0, "", fmt.Errorf("%q is not \"<number>: <name>\"", s)
	}
	n, err := strconv.Atoi(strings.TrimSpace(num))
	if err != nil {
		return 0, "", fmt.Errorf("%q is not \"<number>: <name>\": %w", s, err)
	}
	return n, strings.TrimSpace(name), nil
}

// ParseRate reads a rate file ("400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)")
// into Gb/s.
func ParseRate(s string) (float64, error) {
	num, _, ok := strings.Cut(strings.TrimSpace(s), " Gb/sec")
	if !ok {
		return 0, fmt.Errorf("rate %q is not \"<n> Gb/sec …\"", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || !(v >= 0 && v <= 1e6) {
		return 0, fmt.Errorf("rate %q is not \"<n> Gb/sec …\"", s)
	}
	return v, nil
}

// scan reads every RDMA device under sysRoot/class/infiniband, reading the
// named counters of each port (none: Counters stays nil) (names of files in counters/ or hw_counters/;
// a name in both is read from counters/). It returns fs.ErrNotExist (wrapped)
// when the class directory does not exist: no RDMA driver is loaded. A
// device or port that goes away during the scan is skipped; an attribute
// that cannot be read is left zero.
func (r *reader) scan(sysRoot string, counters []string) ([]Device, error) {
	root := filepath.Join(sysRoot, classDir)
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	if r.static == nil {
		r.static = map[string]*staticDevice{}
	}
	listed := make(map[string]bool, len(entries))
	out := make([]Device, 0, len(entries))
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		listed[e.Name()] = true
		sd, ok := r.static[e.Name()]
		if !ok {
			if sd, err = r.readStatic(dir, e.Name()); err != nil {
				// Gone during the scan, or unreadable: judged as not
				// there (its ports, if known, as gone), the others go on.
				continue
			}
			if sd.complete() {
				// Kept only once probed: a device seen mid-probe,
				// before its ports, is read again next scan.
				r.static[e.Name()] = sd
			}
		}
		d := sd.Device
		d.Ports = make([]Port, 0, len(sd.ports))
		for _, sp := range sd.ports {
			if p, ok := r.port(dir, d.Name, sp, counters); ok {
				d.Ports = append(d.Ports, p)
			}
		}
		out = append(out, d)
	}
	for name := range r.static {
		if !listed[name] {
			delete(r.static, name)
		}
	}
	return out, nil
}

// pciAddress is a PCI function's name in sysfs (domain:bus:device.function).
var pciAddress = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// complete says whether a device was read after its driver finished
// probing it: it has ports, each with a link layer.
func (sd *staticDevice) complete() bool {
	for _, p := range sd.ports {
		if p.linkLayer == "" {
			return false
		}
	}
	return len(sd.ports) > 0
}

// readStatic reads what does not change while a device exists.
func (r *reader) readStatic(dir, name string) (*staticDevice, error) {
	sd := &staticDevice{Device: Device{Name: name}}
	if target, err := filepath.EvalSymlinks(filepath.Join(dir, "device")); err == nil {
		sd.PCI = filepath.Base(target)
		_, vf := os.Lstat(filepath.Join(target, pciPhysicalFunction))
		sd.Physical = pciAddress.MatchString(sd.PCI) && vf != nil
	}
	sd.HCAType, _ = r.word(filepath.Join(dir, "hca_type"))
	sd.FirmwareVersion, _ = r.word(filepath.Join(dir, "fw_ver"))
	ports, err := os.ReadDir(filepath.Join(dir, portsDir))
	if err != nil {
		return nil, err
	}
	for _, pe := range ports {
		n, err := strconv.Atoi(pe.Name())
		if err != nil {
			continue
		}
		ll, _ := r.word(filepath.Join(dir, portsDir, pe.Name(), "link_layer"))
		sd.ports = append(sd.ports, staticPort{num: n, linkLayer: ll})
	}
	slices.SortFunc(sd.ports, func(a, b staticPort) int { return a.num - b.num })
	return sd, nil
}

// port reads one port; false when it went away.
func (r *reader) port(devDir, device string, sp staticPort, counters []string) (Port, bool) {
	dir := filepath.Join(devDir, portsDir, strconv.Itoa(sp.num))
	p := Port{Device: device, Num: sp.num, LinkLayer: sp.linkLayer}
	state, err := r.word(filepath.Join(dir, "state"))
	if err != nil {
		return p, false
	}
	p.State, p.StateText, _ = numbered(state)
	if s, err := r.word(filepath.Join(dir, "phys_state")); err == nil {
		p.PhysState, p.PhysText, _ = numbered(s)
	}
	if s, err := r.word(filepath.Join(dir, "rate")); err == nil {
		p.RateText = s
		p.RateGbps, _ = ParseRate(s)
	}
	if p.LinkLayer == LinkLayerEthernet {
		r.netdev(devDir, &p)
	}
	if len(counters) > 0 {
		p.Counters = make(map[string]uint64, len(counters))
	}
	for _, c := range counters {
		v, err := r.uint(filepath.Join(dir, "counters", c))
		if err != nil {
			v, err = r.uint(filepath.Join(dir, "hw_counters", c))
		}
		if err == nil {
			p.Counters[c] = v
		}
	}
	return p, true
}

// netdev finds a RoCE port's network interface: the one interface under the
// PCI function's net/ directory (mlx5 gives each port its own PCI function,
// so one), and reads its operstate and carrier_changes.
func (r *reader) netdev(devDir string, p *Port) {
	netDir := filepath.Join(devDir, "device", "net")
	ifs, err := os.ReadDir(netDir)
	if err != nil || len(ifs) == 0 {
		return
	}
	name := ifs[0].Name()
	if len(ifs) > 1 {
		// More than one interface on the function (a representor): the
		// port's own is the one whose dev_port is port-1.
		for _, i := range ifs {
			if v, err := r.uint(filepath.Join(netDir, i.Name(), "dev_port")); err == nil && int(v) == p.Num-1 {
				name = i.Name()
				break
			}
		}
	}
	p.Netdev = name
	op, _ := r.word(filepath.Join(netDir, name, "operstate"))
	p.NetdevUp = op == "up"
	if v, err := r.uint(filepath.Join(netDir, name, "carrier_changes")); err == nil {
		p.CarrierChanges, p.HasCarrier = v, true
	}
}

// PCI identifiers of NVIDIA (Mellanox) network adapters, as sysfs prints
// them: the vendor, and the base class and subclass of an Ethernet or
// InfiniBand controller.
const (
	pciVendorMellanox   = "0x15b3"
	pciClassEthernet    = "0x0200"
	pciClassInfiniBand  = "0x0207"
	pciDevicesDir       = "bus/pci/devices"
	pciPhysicalFunction = "physfn"
)

// scanPCI lists the PCI addresses of the Mellanox network and InfiniBand
// controllers' physical functions (a virtual function, which has a physfn
// link, is not an adapter of its own), sorted.
func (r *reader) scanPCI(sysRoot string) ([]string, error) {
	dir := filepath.Join(sysRoot, pciDevicesDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if v, err := r.word(filepath.Join(dir, e.Name(), "vendor")); err != nil || strings.ToLower(v) != pciVendorMellanox {
			continue
		}
		class, err := r.word(filepath.Join(dir, e.Name(), "class"))
		class = strings.ToLower(class)
		if err != nil || !strings.HasPrefix(class, pciClassEthernet) && !strings.HasPrefix(class, pciClassInfiniBand) {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, e.Name(), pciPhysicalFunction)); err == nil {
			continue
		}
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, nil
}
