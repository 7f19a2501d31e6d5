package services

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuhealth/gpuhealth/monitors"
)

// PCI identifiers of NVIDIA's devices, as sysfs prints them (lowercase hex
// with a 0x prefix): the vendor, and the leading base class and subclass
// bytes of the 24-bit class code (the last byte is the programming
// interface).
const (
	pciVendorNVIDIA = "0x10de"
	// pciClassVGA and pciClass3D are display controllers: a GPU with a
	// display engine shows as VGA, a data center GPU as a 3D controller.
	pciClassVGA = "0x0300"
	pciClass3D  = "0x0302"
	// pciClassBridgeOther is how NVSwitches up to the third generation
	// (HGX A100, H100, H200) show: bridge, other.
	pciClassBridgeOther = "0x0680"
)

// PCI is what the PCI bus shows of NVIDIA's GPUs and NVSwitches. Bus ids are
// sysfs's device names (domain:bus:device.function, for example
// 0000:1b:00.0), sorted.
//
// Fourth-generation NVSwitches (HGX B200/B300, HGX B100) are not PCI
// devices: Fabric Manager reaches them through ConnectX-7 bridge functions
// (vendor Mellanox), so NVSwitches is empty on those systems.
type PCI struct {
	// GPUs are NVIDIA devices of class VGA or 3D controller. It is nil when
	// there are none. A GPU that fell off the bus is not listed, so fewer
	// GPUs here than the node should have is a fault of the bus or the
	// GPU; fewer in NVML than here is the driver not using a GPU the bus
	// shows.
	GPUs []string
	// NVSwitches are NVIDIA devices of class bridge/other; nil when there
	// are none.
	NVSwitches []string
}

// ScanPCI lists the NVIDIA GPUs and NVSwitches under
// sysRoot/bus/pci/devices. Inside a container /sys's PCI tree is the host's,
// so sysRoot is normally /sys.
//
// It returns an error wrapping monitors.ErrUnavailable when the device
// directory cannot be listed (sysfs not mounted at sysRoot); callers decide
// whether that matters. A device whose vendor or class cannot be read (it
// went away during the scan) is skipped.
func ScanPCI(sysRoot string) (PCI, error) {
	dir := filepath.Join(sysRoot, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return PCI{}, fmt.Errorf("%w: listing PCI devices: %w", monitors.ErrUnavailable, err)
	}
	var p PCI
	for _, e := range entries {
		// Entries are symbolic links into /sys/devices; reading through
		// them follows the link.
		vendor, err := readSysfsWord(filepath.Join(dir, e.Name(), "vendor"))
		if err != nil || vendor != pciVendorNVIDIA {
			continue
		}
		class, err := readSysfsWord(filepath.Join(dir, e.Name(), "class"))
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(class, pciClassVGA), strings.HasPrefix(class, pciClass3D):
			p.GPUs = append(p.GPUs, e.Name())
		case strings.HasPrefix(class, pciClassBridgeOther):
			p.NVSwitches = append(p.NVSwitches, e.Name())
		}
	}
	slices.Sort(p.GPUs)
	slices.Sort(p.NVSwitches)
	return p, nil
}

// maxSysfsWord bounds what is read of a sysfs attribute: vendor and class
// are a few bytes, and a file of a fake or broken tree is not read whole.
const maxSysfsWord = 64

// readSysfsWord reads a short sysfs attribute, trimmed and lowercased.
func readSysfsWord(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, maxSysfsWord)
	n, err := f.Read(buf)
	if n == 0 && err != nil {
		return "", err
	}
	return strings.ToLower(strings.TrimSpace(string(buf[:n]))), nil
}
