package services

import (
	"errors"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/monitors"
)

func TestScanPCI(t *testing.T) {
	cases := []struct {
		name  string
		setup func(h *host)
		want  PCI
	}{
		{
			name:  "an HGX H100 board: eight 3D controllers and four NVSwitches, sorted",
			setup: func(h *host) { h.hgx(8, 4) },
			want: PCI{
				GPUs:       []string{"0000:18:00.0", "0000:28:00.0", "0000:38:00.0", "0000:48:00.0", "0000:58:00.0", "0000:68:00.0", "0000:78:00.0", "0000:88:00.0"},
				NVSwitches: []string{"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"},
			},
		},
		{
			name: "a VGA GPU with its audio function, uppercase hex and no NVSwitch",
			setup: func(h *host) {
				h.pciDevice("0000:01:00.0", "0x10DE", "0x030000")
				h.pciDevice("0000:01:00.1", pciVendorNVIDIA, "0x040300")
			},
			want: PCI{GPUs: []string{"0000:01:00.0"}},
		},
		{
			name: "other vendors' devices of the same classes, and ConnectX-7 bridges",
			setup: func(h *host) {
				h.pciDevice("0000:00:02.0", "0x8086", "0x030000")
				h.pciDevice("0000:00:1f.0", "0x8086", "0x068000")
				h.pciDevice("0000:05:00.0", "0x15b3", "0x020700")
			},
		},
		{
			name: "a device whose class cannot be read, and one without vendor",
			setup: func(h *host) {
				h.write(filepath.Join(h.sys, "bus", "pci", "devices", "0000:1b:00.0", "vendor"), "0x10de\n")
				h.write(filepath.Join(h.sys, "bus", "pci", "devices", "0000:2b:00.0", "class"), "0x030200\n")
				h.pciDevice("0000:3b:00.0", pciVendorNVIDIA, "0x030200")
			},
			want: PCI{GPUs: []string{"0000:3b:00.0"}},
		},
		{
			name:  "no devices",
			setup: func(*host) {},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			h := newHost(t)
			tc.setup(h)
			got, err := ScanPCI(h.sys)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

func TestScanPCIUnavailable(t *testing.T) {
	g := NewWithT(t)
	_, err := ScanPCI(filepath.Join(t.TempDir(), "sys"))
	g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(BeTrue())
	g.Expect(err).To(MatchError(ContainSubstring("listing PCI devices")))
}
