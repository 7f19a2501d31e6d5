package kmsg

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestParse(t *testing.T) {
	cases := []struct {
		name    string
		record  string
		want    Entry
		wantErr string
	}{
		{
			name:   "An XID 79 with pid and name gives the GPU, the code and the text.",
			record: "3,1234,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 1234, Timestamp: 5 * time.Second, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 79, Link: -1,
				Text: "pid=1234, name=python, GPU has fallen off the bus."},
		},
		{
			name:   "An XID 13 without pid and name keeps the whole text.",
			record: "4,17,123456789,-;NVRM: Xid (PCI:0000:b7:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 17, Timestamp: 123456789 * time.Microsecond, Kind: KindXID, PCIBusID: "0000:b7:00.0", Code: 13, Link: -1,
				Text: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"},
		},
		{
			name:   "An XID whose address has no PCI prefix is read the same.",
			record: "4,18,1,-;NVRM: Xid (0000:3b:00): 31, pid=77, name=train, Ch 00000010, intr 00000000. MMU Fault",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 18, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 31, Link: -1,
				Text: "pid=77, name=train, Ch 00000010, intr 00000000. MMU Fault"},
		},
		{
			name:   "An XID whose address has no domain gets domain 0.",
			record: "4,19,1,-;NVRM: Xid (PCI:3b:00): 48, An uncorrectable double bit error",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 19, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 48, Link: -1,
				Text: "An uncorrectable double bit error"},
		},
		{
			name:   "An XID with an upper-case address and a function is lowered.",
			record: "4,20,1,-;NVRM: Xid (PCI:0001:B7:1F.3): 94, Contained ECC error",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 20, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0001:b7:1f.3", Code: 94, Link: -1,
				Text: "Contained ECC error"},
		},
		{
			name:   "An XID 154 keeps the recovery action text for the catalog's decode.",
			record: "4,21,1,-;NVRM: Xid (PCI:0000:3b:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 21, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 154, Link: -1,
				Text: "pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"},
		},
		{
			name:   "An XID with no text after the code is still an XID.",
			record: "4,22,1,-;NVRM: Xid (PCI:0000:3b:00): 79",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 22, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 79, Link: -1},
		},
		{
			name:   "A record's dictionary lines after the first line are ignored.",
			record: "3,23,1,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 23, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 79, Link: -1,
				Text: "GPU has fallen off the bus."},
		},
		{
			name:   "A record prefix with more fields than four is read.",
			record: "3,24,1,c,extra;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 24, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 79, Link: -1,
				Text: "GPU has fallen off the bus."},
		},
		{
			name:   "An XID marker after other text is not ours: the driver's line starts the message.",
			record: "3,25,1,-;[ 1234.5678] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 25, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "An XID line quoted inside another kernel line is not ours.",
			record: `5,26,1,-;audit: type=1400 comm="sh" cmdline="echo NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."`,
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 26, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "An SXid headline after other text is not ours.",
			record: "3,27,1,-;foo: nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 27, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "A GPU-lost text after other text is not ours.",
			record: "3,28,1,-;foo: NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 28, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "An SXid headline without the device name is ours.",
			record: "3,29,1,-;SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 29, Timestamp: time.Microsecond, Kind: KindSXID, PCIBusID: "0000:05:00.0", Code: 20034, Flag: "Fatal", Fatal: true, Link: 30,
				Text: "Link 30 LTSSM Fault Up"},
		},
		// A process that writes to /dev/kmsg gets facility 1 (LOG_USER) or
		// the one it names, never 0: priority = facility*8 + level.
		{
			name:   "An XID line a process wrote (facility 1, level 3) is not ours.",
			record: "11,90,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 90, Timestamp: time.Microsecond, Link: -1, Userspace: true},
		},
		{
			name:   "An XID line a process wrote at level 0 (priority 8) is not ours.",
			record: "8,91,1,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 91, Timestamp: time.Microsecond, Link: -1, Userspace: true},
		},
		{
			name:   "An SXid line a process wrote with the daemon facility is not ours.",
			record: "27,92,1,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 92, Timestamp: time.Microsecond, Link: -1, Userspace: true},
		},
		{
			name:   "A GPU-lost text a process wrote is not ours.",
			record: "11,93,1,-;NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 93, Timestamp: time.Microsecond, Link: -1, Userspace: true},
		},
		{
			name:   "A malformed XID line a process wrote is not read at all.",
			record: "14,94,1,-;NVRM: Xid (PCI:zz:00): seventy-nine",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 94, Timestamp: time.Microsecond, Link: -1, Userspace: true},
		},
		{
			name:   "A kernel XID line at debug level (priority 7) is ours.",
			record: "7,95,1,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 95, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 79, Link: -1,
				Text: "GPU has fallen off the bus."},
		},
		{
			name:   "A fatal SXid gives the switch, the code, the link and the text.",
			record: "3,30,9000000,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 30, Timestamp: 9 * time.Second, Kind: KindSXID, PCIBusID: "0000:05:00.0", Code: 20034, Flag: "Fatal", Fatal: true, Link: 30,
				Text: "Link 30 LTSSM Fault Up"},
		},
		{
			name:   "A non-fatal SXid is not fatal.",
			record: "4,31,9000001,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 58 egress non-posted PRIV error (First)",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 31, Timestamp: 9000001 * time.Microsecond, Kind: KindSXID, PCIBusID: "0000:07:00.0", Code: 12028, Flag: "Non-fatal", Link: 58,
				Text: "Link 58 egress non-posted PRIV error (First)"},
		},
		{
			name:   "An SXid that names no link has link -1.",
			record: "4,32,1,-;nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 22013, Non-fatal, Minion Link DLREQ interrupt",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 32, Timestamp: time.Microsecond, Kind: KindSXID, PCIBusID: "0000:86:00.0", Code: 22013, Flag: "Non-fatal", Link: -1,
				Text: "Minion Link DLREQ interrupt"},
		},
		// Shapes from the driver's own formats (open GPU kernel modules:
		// kernel_rc.c XID_PRINT_WITH_ATTR "Xid (PCI:%04x:%02x:%02x GPU-I:%02u
		// GPU-CI:%02u): %d, pid=%s, name=%s, %s%s"; nvswitch NVSWITCH_PRINT_SXID
		// "SXid (PCI:%04x:%02x:%02x.%x): %05d, " with "Fatal, Link %02d %s%s",
		// "Non-fatal, …", "Correctable, Link %02d …", "SOE HALTED"; osapi.c and
		// osinit.c for the GPU-lost texts).
		{
			name:   "A MIG XID names the GPU instance and the compute instance.",
			record: "4,60,1,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception",
			want: Entry{GPUInstance: 1, ComputeInstance: 2, Seq: 60, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 13, Link: -1,
				Text: "pid=9, name=a, Graphics Exception"},
		},
		{
			name:   "A MIG XID may name the GPU instance alone.",
			record: "4,61,1,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:00): 48, pid=9, name=a, DBE",
			want: Entry{GPUInstance: 0, ComputeInstance: -1, Seq: 61, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 48, Link: -1,
				Text: "pid=9, name=a, DBE"},
		},
		{
			name:    "A compute instance without a GPU instance is malformed.",
			record:  "4,62,1,-;NVRM: Xid (PCI:0000:3b:00 GPU-CI:02): 13, x",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 62, Timestamp: time.Microsecond, Link: -1},
			wantErr: "MIG attribute",
		},
		{
			name:   "XID 45 keeps the driver's caused-by suffix.",
			record: "4,63,1,-;NVRM: Xid (PCI:0000:3b:00): 45, pid=9, name=a, Ch 00000010 caused by previous Xid 48",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 63, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:3b:00.0", Code: 45, Link: -1,
				Text: "pid=9, name=a, Ch 00000010 caused by previous Xid 48"},
		},
		{
			name:   "An XID number the catalog does not know is read (a newer driver).",
			record: "4,64,1,-;NVRM: Xid (PCI:0000:05:00): 20001, unknown error",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 64, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0000:05:00.0", Code: 20001, Link: -1,
				Text: "unknown error"},
		},
		{
			name:   "An NVLink5 XID keeps its registers in the text.",
			record: "4,65,1,-;NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 65, Timestamp: time.Microsecond, Kind: KindXID, PCIBusID: "0008:01:00.0", Code: 149, Link: -1,
				Text: "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"},
		},
		{
			name:   "An SXid headline without a severity flag is ours (SOE HALTED).",
			record: "3,66,1,-;nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 66, Timestamp: time.Microsecond, Kind: KindSXID, PCIBusID: "0004:00:00.0", Code: 26006, Link: -1,
				Text: "SOE HALTED"},
		},
		{
			name:   "SOE EXTERR is a headline.",
			record: "3,67,1,-;nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26007, SOE EXTERR",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 67, Timestamp: time.Microsecond, Kind: KindSXID, PCIBusID: "0004:00:00.0", Code: 26007, Link: -1,
				Text: "SOE EXTERR"},
		},
		{
			name:   "SOE Watchdog error is a headline.",
			record: "3,68,1,-;nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26008, SOE Watchdog error",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 68, Timestamp: time.Microsecond, Kind: KindSXID, PCIBusID: "0004:00:00.0", Code: 26008, Link: -1,
				Text: "SOE Watchdog error"},
		},
		{
			name:   "SOE HALT data lines are details of the halt.",
			record: "3,69,1,-;nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALT data[0] = 0x               0",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 69, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "A correctable SXid is ours, with its link.",
			record: "6,70,1,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Correctable, Link 32 egress non-posted PRIV error (First)",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 70, Timestamp: time.Microsecond, Kind: KindSXID, PCIBusID: "0000:05:00.0", Code: 12028, Flag: "Correctable", Link: 32,
				Text: "Link 32 egress non-posted PRIV error (First)"},
		},
		{
			name:   "A fatal SXid without a link (the chiplet form) is ours.",
			record: "3,71,1,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 10003, Fatal, unhandled interrupt in nvswitch_service_x(123)",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 71, Timestamp: time.Microsecond, Kind: KindSXID, PCIBusID: "0000:05:00.0", Code: 10003, Flag: "Fatal", Fatal: true, Link: -1,
				Text: "unhandled interrupt in nvswitch_service_x(123)"},
		},
		{
			name:   "The runtime GPU-lost line without an XID is a lost GPU.",
			record: "3,72,1,-;NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 72, Timestamp: time.Microsecond, Kind: KindGPULost, PCIBusID: "0000:01:00.0", Code: 79, Link: -1,
				Text: "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus."},
		},
		{
			name:   "The probe-time GPU-lost text in one record (escaped newlines) is a lost GPU.",
			record: `3,73,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0\x0aNVRM: (PCI ID: 10de:26b5) installed in this system has\x0aNVRM: fallen off the bus and is not responding to commands.`,
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 73, Timestamp: time.Microsecond, Kind: KindGPULost, PCIBusID: "0000:b3:00.0", Code: 79, Link: -1,
				Text: "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is not responding to commands."},
		},
		{
			name:   "The probe-time GPU-lost text on one line is a lost GPU.",
			record: "3,74,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is not responding to commands.",
			want: Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 74, Timestamp: time.Microsecond, Kind: KindGPULost, PCIBusID: "0000:b3:00.0", Code: 79, Link: -1,
				Text: "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is not responding to commands."},
		},
		{
			name:   "The first GPU-lost line alone is not ours (the Joiner waits for the rest).",
			record: "3,75,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 75, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "An unsupported-GPU notice is not a lost GPU.",
			record: "4,76,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system is not supported by the NVIDIA 535 driver release.",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 76, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "An SXid detail line after the headline is not ours.",
			record: "4,33,1,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Severity 0 Engine instance 58 Sub-engine instance 00",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 33, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "An SXid data line after the headline is not ours.",
			record: "4,34,1,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Data {0x00000000, 0x00000000, 0x00000000}",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 34, Timestamp: time.Microsecond, Link: -1},
		},
		{
			name:   "A continuation line on its own is not ours.",
			record: " SUBSYSTEM=pci",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Link: -1},
		},
		{
			name:   "An empty line is not ours.",
			record: "",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Link: -1},
		},
		{
			name:   "Another kernel line is not ours but keeps its sequence number.",
			record: "6,100,5000,-;e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 100, Timestamp: 5 * time.Millisecond, Link: -1},
		},
		{
			name:   "Another NVRM line is not ours.",
			record: "5,101,5000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.86.15",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 101, Timestamp: 5 * time.Millisecond, Link: -1},
		},
		{
			name:   "A line that mentions XIDs in other words is not ours.",
			record: "6,102,5000,-;gpuhealth: checking for Xid errors",
			want:   Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 102, Timestamp: 5 * time.Millisecond, Link: -1},
		},
		{
			name:    "An XID line without a code is malformed.",
			record:  "3,40,1,-;NVRM: Xid (PCI:0000:3b:00): , GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 40, Timestamp: time.Microsecond, Link: -1},
			wantErr: "not a number",
		},
		{
			name:    "An XID line with a word for a code is malformed.",
			record:  "3,41,1,-;NVRM: Xid (PCI:0000:3b:00): seventy-nine, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 41, Timestamp: time.Microsecond, Link: -1},
			wantErr: "not a number",
		},
		{
			name:    "An XID line whose code runs into letters is malformed.",
			record:  "3,42,1,-;NVRM: Xid (PCI:0000:3b:00): 79abc, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 42, Timestamp: time.Microsecond, Link: -1},
			wantErr: "not a number",
		},
		{
			name:    "An XID over 99999 is malformed.",
			record:  "3,43,1,-;NVRM: Xid (PCI:0000:3b:00): 100000, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 43, Timestamp: time.Microsecond, Link: -1},
			wantErr: "over 99999",
		},
		{
			name:    "An XID with a huge number is malformed, not an overflow.",
			record:  "3,44,1,-;NVRM: Xid (PCI:0000:3b:00): 99999999999999999999999, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 44, Timestamp: time.Microsecond, Link: -1},
			wantErr: "over 999",
		},
		{
			name:    "An XID without the parenthesised address is malformed.",
			record:  "3,45,1,-;NVRM: Xid 79, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 45, Timestamp: time.Microsecond, Link: -1},
			wantErr: "no '('",
		},
		{
			name:    "An XID whose address is cut off is malformed.",
			record:  "3,46,1,-;NVRM: Xid (PCI:0000:3b:0",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 46, Timestamp: time.Microsecond, Link: -1},
			wantErr: "no ')'",
		},
		{
			name:    "An XID with a bad PCI address is malformed.",
			record:  "3,47,1,-;NVRM: Xid (PCI:zz:00): 79, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 47, Timestamp: time.Microsecond, Link: -1},
			wantErr: "PCI address",
		},
		{
			name:    "An XID without the colon after the address is malformed.",
			record:  "3,48,1,-;NVRM: Xid (PCI:0000:3b:00) 79, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 48, Timestamp: time.Microsecond, Link: -1},
			wantErr: "no ':'",
		},
		{
			name:    "An SXid over 99999 is malformed.",
			record:  "3,49,1,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 200340, Fatal, Link 30 LTSSM Fault Up",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Seq: 49, Timestamp: time.Microsecond, Link: -1},
			wantErr: "over 99999",
		},
		{
			name:    "A line without a record prefix is malformed.",
			record:  "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Link: -1},
			wantErr: "no ';'",
		},
		{
			name:    "A record prefix with a word for a sequence number is malformed.",
			record:  "3,abc,1,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Link: -1},
			wantErr: "sequence",
		},
		{
			name:    "A record prefix with too few fields is malformed.",
			record:  "3,1;hello",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Link: -1},
			wantErr: "fewer than 3 fields",
		},
		{
			name:    "Garbage is malformed.",
			record:  "\x00\x01\xffgarbage",
			want:    Entry{GPUInstance: -1, ComputeInstance: -1, Link: -1},
			wantErr: "no ';'",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := Parse(tc.record)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ErrMalformed))
				g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
			} else {
				g.Expect(err).NotTo(HaveOccurred())
			}
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

func TestNormalizePCIBusID(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    string
		wantErr bool
	}{
		{name: "The kernel's XID form gets function 0.", in: "PCI:0000:3b:00", want: "0000:3b:00.0"},
		{name: "The NVSwitch form is kept.", in: "PCI:0000:05:00.0", want: "0000:05:00.0"},
		{name: "NVML's eight-digit upper-case domain is shortened and lowered.", in: "00000000:3B:00.0", want: "0000:3b:00.0"},
		{name: "A missing domain is domain 0.", in: "3b:00.0", want: "0000:3b:00.0"},
		{name: "A missing domain and function are both 0.", in: "3b:00", want: "0000:3b:00.0"},
		{name: "A large domain keeps all its digits.", in: "10000:01:00.0", want: "10000:01:00.0"},
		{name: "Single hex digits are padded.", in: "0:3:1.2", want: "0000:03:01.2"},
		{name: "A lower-case prefix is accepted.", in: "pci:0000:3b:00", want: "0000:3b:00.0"},
		{name: "A device over 0x1f is rejected.", in: "0000:3b:20.0", wantErr: true},
		{name: "A function over 7 is rejected.", in: "0000:3b:00.8", wantErr: true},
		{name: "A bus of three digits is rejected.", in: "0000:13b:00.0", wantErr: true},
		{name: "A domain of nine digits is rejected.", in: "000000000:3b:00.0", wantErr: true},
		{name: "Too many fields are rejected.", in: "0000:00:3b:00.0", wantErr: true},
		{name: "One field is rejected.", in: "3b", wantErr: true},
		{name: "Signs are rejected.", in: "+0:3b:00", wantErr: true},
		{name: "An empty string is rejected.", in: "", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := NormalizePCIBusID(tc.in)
			if tc.wantErr {
				g.Expect(err).To(HaveOccurred())
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

func FuzzParse(f *testing.F) {
	seeds := []string{
		"3,1234,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
		"4,17,1,-;NVRM: Xid (0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
		"4,21,1,-;NVRM: Xid (PCI:0000:3b:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
		"3,30,9000000,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
		"4,31,1,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 58 egress non-posted PRIV error (First)",
		"4,33,1,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Severity 0 Engine instance 58 Sub-engine instance 00",
		"3,23,1,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
		" SUBSYSTEM=pci",
		"6,100,5000,-;e1000e 0000:00:1f.6 eno1: NIC Link is Up",
		"3,43,1,-;NVRM: Xid (PCI:0000:3b:00): 1000, x",
		"3,44,1,-;NVRM: Xid (PCI:0000:3b:00): 99999999999999999999999",
		"3,1;hello",
		"",
		"4,60,1,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception",
		"4,61,1,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:01): 31, pid=9, name=a, MMU Fault",
		"4,62,1,-;NVRM: Xid (PCI:0000:3b:00 GPU-CI:02 GPU-I:01): 31, x",
		"3,66,1,-;nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED",
		"3,69,1,-;nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALT data[0] = 0x               0",
		"6,70,1,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Correctable, Link 32 egress non-posted PRIV error (First)",
		"3,72,1,-;NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
		`3,73,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0\x0aNVRM: (PCI ID: 10de:26b5) installed in this system has\x0aNVRM: fallen off the bus and is not responding to commands.`,
		"4,74,1,-;NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
		"4,75,1,-;NVRM: Xid (PCI:0001:00:00): 79 Recommended Action=CONTACT_SUPPORT",
		"4,76,1,-;NVRM: Xid (PCI:0000:05:00): 99999, unknown error",
		"11,90,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
		"27,92,1,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
		"3,25,1,-;[ 1234.5678] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
		"3,29,1,-;SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
		"3,100,1,-;mlx5_core 0000:05:00.0: poll_health:840:(pid 0): device's health compromised - reached miss count",
		"3,101,1,-;mlx5_core 0000:0d:00.0: print_health_info:447:(pid 0): synd 0x1: firmware internal error",
		"4,102,1,-;mlx5_core 0000:56:00.0: wait_func:1189:(pid 72061): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
		"3,103,1,-;mlx5_core 0000:81:00.0: port_module:252:(pid 0): Port module event[error]: module 0, Cable error, Power budget exceeded",
		"6,104,1,-;mlx5_core 0000:08:00.0: Port module event: module 0, Cable unplugged",
		"4,105,1,-;NETDEV WATCHDOG: eth1 (mlx5_core): transmit queue 19 timed out",
		"3,106,1,-;mlx5_core 0000:13:00.1 eth1: TX timeout on queue: 19, SQ: 0xab6, CQ: 0xd4a, SQ Cons: 0x3fd7 SQ Prod: 0x3fe6, usecs since last trans: 27541000",
		"2,107,1,-;mlx5_core 0000:c1:00.0 ens1f0np0: NETDEV WATCHDOG: CPU: 12: transmit queue 3 timed out 5120 ms",
		"3,108,1,-;mlx5_core 0000:c1:00.0 (unnamed net_device) (uninitialized): TX timeout detected",
		"3,109,1,-;mlx5_core 0000:c1:00.0: 0000:c1:00.0:poll_health:694:(pid 0): Fatal error 1 detected",
		"3,110,1,-;mlx5_core 0000:41:00.1: health recovery flow aborted, PCI reads still not working",
		"3,111,1,-;mlx5_core 0000:c1:20.0: poll_health:840:(pid 0): Fatal error 1 detected",
		"6,112,1,-;mlx5_core 0000:13:00.0: modify lag map port 1:1 port 2:1",
		"11,113,1,-;mlx5_core 0000:c1:00.0: poll_health:840:(pid 0): Fatal error 1 detected",
		`3,114,1,-;mlx5_core 0000:c1:00.0: poll_health:840:(pid 0): Fatal error 1 detected\x0aNVRM: Xid (PCI:0000:3b:00): 79, x`,
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, record string) {
		e, err := Parse(record)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrMalformed", record, err)
			}
			if e.Kind != KindNone {
				t.Fatalf("Parse(%q) returned kind %q with an error", record, e.Kind)
			}
			return
		}
		if e.Userspace && e.Kind != KindNone {
			t.Fatalf("Parse(%q) = %+v: a record a process wrote is ours", record, e)
		}
		if e.Kind != KindNone {
			prio, _, _ := strings.Cut(record, ",")
			if p, err := strconv.Atoi(prio); err != nil || p>>3 != 0 {
				t.Fatalf("Parse(%q) = %+v: a record whose facility is not the kernel's is ours", record, e)
			}
			_, msg, _ := strings.Cut(record, ";")
			prefix := []string{"NVRM: ", "nvidia-nvswitch", "SXid"}
			if e.Kind == KindNIC {
				prefix = []string{"mlx5_core ", "NETDEV WATCHDOG: "}
			}
			if !slices.ContainsFunc(prefix, func(p string) bool { return strings.HasPrefix(msg, p) }) {
				t.Fatalf("Parse(%q) = %+v: a message that does not start with the driver's prefix is ours", record, e)
			}
		}
		if e.Kind != KindNIC && (e.Netdev != "" || e.NICCode != "") {
			t.Fatalf("Parse(%q) = %+v: NIC fields on another kind", record, e)
		}
		switch e.Kind {
		case KindNone:
			if e.PCIBusID != "" || e.Code != 0 || e.Text != "" || e.Fatal || e.Link != -1 {
				t.Fatalf("Parse(%q) = %+v: a record that is not ours carries fields", record, e)
			}
		case KindNIC:
			if _, ok := nicVerdicts[e.NICCode]; !ok {
				t.Fatalf("Parse(%q) NIC code %q is not in the table", record, e.NICCode)
			}
			if e.PCIBusID == "" && e.Netdev == "" {
				t.Fatalf("Parse(%q) = %+v: a NIC line names no address and no interface", record, e)
			}
			if e.PCIBusID != "" {
				if n, err := NormalizePCIBusID(e.PCIBusID); err != nil || n != e.PCIBusID {
					t.Fatalf("Parse(%q) bus id %q is not canonical", record, e.PCIBusID)
				}
			}
			if e.Netdev != "" && !nicComponentID.MatchString(e.Netdev) {
				t.Fatalf("Parse(%q) interface %q cannot be a component id", record, e.Netdev)
			}
			if e.Text == "" || strings.Contains(e.Text, "\n") || !strings.Contains(record, e.Text) {
				t.Fatalf("Parse(%q) text %q is not one line of the record", record, e.Text)
			}
			if e.Code != 0 || e.Fatal || e.Flag != "" || e.Link != -1 || e.GPUInstance != -1 || e.ComputeInstance != -1 {
				t.Fatalf("Parse(%q) = %+v: a NIC line carries GPU fields", record, e)
			}
		case KindGPULost:
			if n, err := NormalizePCIBusID(e.PCIBusID); err != nil || n != e.PCIBusID || e.Code != 79 {
				t.Fatalf("Parse(%q) = %+v: a lost GPU needs its canonical bus id and XID 79", record, e)
			}
		case KindXID, KindSXID:
			if n, err := NormalizePCIBusID(e.PCIBusID); err != nil || n != e.PCIBusID {
				t.Fatalf("Parse(%q) bus id %q is not canonical", record, e.PCIBusID)
			}
			limit := maxXID
			if e.Kind == KindSXID {
				limit = maxSXID
			}
			if e.Code < 0 || e.Code > limit {
				t.Fatalf("Parse(%q) code %d is out of range", record, e.Code)
			}
			if e.Kind == KindXID && (e.Fatal || e.Link != -1 || e.Flag != "") {
				t.Fatalf("Parse(%q) XID has SXid fields: %+v", record, e)
			}
			if e.Kind == KindSXID && (e.GPUInstance != -1 || e.ComputeInstance != -1 || e.Fatal != (e.Flag == "Fatal")) {
				t.Fatalf("Parse(%q) SXid fields are inconsistent: %+v", record, e)
			}
			if e.ComputeInstance >= 0 && e.GPUInstance < 0 {
				t.Fatalf("Parse(%q) has a compute instance without a GPU instance: %+v", record, e)
			}
			if strings.Contains(e.Text, "\n") {
				t.Fatalf("Parse(%q) text spans lines", record)
			}
			if !strings.Contains(record, strconv.Itoa(e.Code)) {
				t.Fatalf("Parse(%q) code %d is not in the record", record, e.Code)
			}
		default:
			t.Fatalf("Parse(%q) returned unknown kind %q", record, e.Kind)
		}
		if e.Timestamp < 0 {
			t.Fatalf("Parse(%q) timestamp %v is negative", record, e.Timestamp)
		}
	})
}
