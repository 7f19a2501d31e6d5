// Package ibfake writes sysfs trees shaped like a node's RDMA adapters, for
// the ib source's tests, the end-to-end suite's fake nodes and the agent
// benchmark: ConnectX-7 InfiniBand ports and RoCE ports with their network
// interfaces, whose state, rate and counters a test changes while the source
// reads them.
//
// The shape follows the kernel's sysfs ABI
// (Documentation/ABI/stable/sysfs-class-infiniband) as a ConnectX-7 shows
// it: class/infiniband/<device>/{hca_type,fw_ver,board_id,node_guid,device}
// with ports/<n>/{state,phys_state,rate,link_layer,counters/,hw_counters/};
// the device link points at the PCI function under devices/, which
// bus/pci/devices/ links to too (vendor 0x15b3, class 0x020700 for
// InfiniBand, 0x020000 for Ethernet) and whose net/<ifname>/ is a RoCE
// port's interface.
package ibfake

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// HCA is one adapter function with one port.
type HCA struct {
	// Name is the RDMA device (mlx5_0); PCI its function (0000:1a:00.0).
	Name, PCI string
	// LinkLayer is InfiniBand or Ethernet; Rate the rate file's text.
	LinkLayer, Rate string
	// HCAType is hca_type (MT4129 for ConnectX-7), Firmware fw_ver.
	HCAType, Firmware string
	// Netdev is an Ethernet port's interface name.
	Netdev string
	// VF makes it an SR-IOV virtual function (its PCI function has a
	// physfn link), as a VF handed to a pod shows on the host.
	VF bool
}

// CX7 is ConnectX-7's hca_type.
const CX7 = "MT4129"

// NDR is the rate file of a 4X NDR (400 Gb/s) port, HDR of 4X HDR.
const (
	NDR = "400 Gb/sec (4X NDR)"
	HDR = "200 Gb/sec (4X HDR)"
)

// InfiniBand returns the i-th ConnectX-7 InfiniBand adapter of a node:
// mlx5_<i> at PCI bus 0x1a+0x10·i, 4X NDR.
func InfiniBand(i int) HCA {
	return HCA{Name: fmt.Sprintf("mlx5_%d", i), PCI: fmt.Sprintf("0000:%02x:00.0", 0x1a+0x10*i), LinkLayer: "InfiniBand",
		Rate: NDR, HCAType: CX7, Firmware: "28.39.1002"}
}

// RoCE returns a ConnectX-7 Ethernet (RoCE) adapter named mlx5_<i> whose
// interface is ens<i>np0, at PCI bus 0xc1+i, 400 Gb/s.
func RoCE(i int) HCA {
	return HCA{Name: fmt.Sprintf("mlx5_%d", i), PCI: fmt.Sprintf("0000:%02x:00.0", 0xc1+i), LinkLayer: "Ethernet",
		Rate: "400 Gb/sec (4X NDR)", HCAType: CX7, Firmware: "28.39.1002", Netdev: fmt.Sprintf("ens%dnp0", i)}
}

// Counters are the port counters each port starts with (all zero): the IB
// PortCounters and mlx5's hw_counters the source reads.
var Counters = []string{"symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
	"port_rcv_remote_physical_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
	"port_xmit_discards", "port_xmit_data", "port_rcv_data"}

// HWCounters are mlx5's hw_counters each port starts with.
var HWCounters = []string{"local_ack_timeout_err", "out_of_sequence", "packet_seq_err"}

// Write writes the adapters under root (a sysfs root), each port up.
func Write(root string, hcas ...HCA) error {
	for _, h := range hcas {
		if err := write(root, h); err != nil {
			return fmt.Errorf("writing %s: %w", h.Name, err)
		}
	}
	return nil
}

func write(root string, h HCA) error {
	fn := filepath.Join(root, "devices", "pci0000:00", h.PCI)
	class := "0x020700"
	if h.LinkLayer == "Ethernet" {
		class = "0x020000"
	}
	files := map[string]string{
		filepath.Join(fn, "vendor"): "0x15b3",
		filepath.Join(fn, "device"): "0x1021",
		filepath.Join(fn, "class"):  class,
	}
	dev := filepath.Join(root, "class", "infiniband", h.Name)
	port := filepath.Join(dev, "ports", "1")
	files[filepath.Join(dev, "hca_type")] = h.HCAType
	files[filepath.Join(dev, "fw_ver")] = h.Firmware
	files[filepath.Join(dev, "board_id")] = "MT_0000000838"
	files[filepath.Join(port, "link_layer")] = h.LinkLayer
	files[filepath.Join(port, "rate")] = h.Rate
	for _, c := range Counters {
		files[filepath.Join(port, "counters", c)] = "0"
	}
	for _, c := range HWCounters {
		files[filepath.Join(port, "hw_counters", c)] = "0"
	}
	if h.Netdev != "" {
		nd := filepath.Join(fn, "net", h.Netdev)
		files[filepath.Join(nd, "operstate")] = "up"
		files[filepath.Join(nd, "carrier_changes")] = "2"
		files[filepath.Join(nd, "dev_port")] = "0"
	}
	for p, v := range files {
		if err := writeFile(p, v); err != nil {
			return err
		}
	}
	for _, f := range []string{"state", "phys_state"} {
		if err := writeFile(filepath.Join(port, f), map[string]string{"state": "4: ACTIVE", "phys_state": "5: LinkUp"}[f]); err != nil {
			return err
		}
	}
	links := map[string]string{
		filepath.Join(root, "bus", "pci", "devices", h.PCI): fn,
		filepath.Join(dev, "device"):                        fn,
	}
	if h.VF {
		links[filepath.Join(fn, "physfn")] = filepath.Join(root, "devices", "pci0000:00", "0000:00:00.0")
	}
	for link, target := range links {
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		rel, err := filepath.Rel(filepath.Dir(link), target)
		if err != nil {
			return err
		}
		if err := os.Symlink(rel, link); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return nil
}

// SetPort sets a port ACTIVE and LinkUp, or DOWN and Polling (a cable
// pulled, the far end gone). A port that goes from up to down counts one
// more in link_downed, as the kernel's LinkDownedCounter does.
func SetPort(root, device string, port int, up bool) error {
	state, phys := "4: ACTIVE", "5: LinkUp"
	if !up {
		state, phys = "1: DOWN", "2: Polling"
	}
	dir := portDir(root, device, port)
	was, _ := os.ReadFile(filepath.Join(dir, "state"))
	if !up && strings.TrimSpace(string(was)) == "4: ACTIVE" {
		if err := bump(filepath.Join(dir, "counters", "link_downed")); err != nil {
			return err
		}
	}
	if err := writeFile(filepath.Join(dir, "state"), state); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "phys_state"), phys)
}

// bump adds one to a counter file.
func bump(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return err
	}
	return writeFile(path, strconv.FormatUint(v+1, 10))
}

// SetRate sets a port's rate file.
func SetRate(root, device string, port int, rate string) error {
	return writeFile(filepath.Join(portDir(root, device, port), "rate"), rate)
}

// SetCounter sets one of a port's counters (counters/ or, for the names in
// HWCounters, hw_counters/).
func SetCounter(root, device string, port int, name string, v uint64) error {
	sub := "counters"
	for _, c := range HWCounters {
		if c == name {
			sub = "hw_counters"
		}
	}
	return writeFile(filepath.Join(portDir(root, device, port), sub, name), strconv.FormatUint(v, 10))
}

// SetNetdev sets a RoCE adapter's interface operstate; a change counts one
// carrier change, as the kernel's carrier_changes does.
func SetNetdev(root string, h HCA, up bool) error {
	nd := filepath.Join(root, "devices", "pci0000:00", h.PCI, "net", h.Netdev)
	op := "down"
	if up {
		op = "up"
	}
	was, err := os.ReadFile(filepath.Join(nd, "operstate"))
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(was)) != op {
		if err := bump(filepath.Join(nd, "carrier_changes")); err != nil {
			return err
		}
	}
	return writeFile(filepath.Join(nd, "operstate"), op)
}

// SetCarrierChanges sets a RoCE interface's carrier_changes, for downs and
// ups no scan saw.
func SetCarrierChanges(root string, h HCA, v uint64) error {
	return writeFile(filepath.Join(root, "devices", "pci0000:00", h.PCI, "net", h.Netdev, "carrier_changes"), strconv.FormatUint(v, 10))
}

// Unbind removes an adapter's RDMA device, as a driver that let go of it
// (or never bound) leaves it; its PCI function stays.
func Unbind(root, device string) error {
	return os.RemoveAll(filepath.Join(root, "class", "infiniband", device))
}

func portDir(root, device string, port int) string {
	return filepath.Join(root, "class", "infiniband", device, "ports", strconv.Itoa(port))
}

// writeFile replaces a file's content in one rename, so that a reader never
// sees it half written.
func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
