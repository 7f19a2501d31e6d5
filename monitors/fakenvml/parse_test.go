package fakenvml

import (
	"bytes"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// twoDevices declares devices 0 and 1 for the lines that refer to them.
const twoDevices = "device uuid=GPU-a pci=0000:3b:00.0 links=18\ndevice uuid=GPU-b pci=0000:5c:00.0 links=4\n"

func TestParseValid(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		devices []string
		ops     []string
	}{
		{
			name:    "a device with every key is taken as written",
			in:      `device index=0 uuid=GPU-1234 pci=0000:3b:00.0 name="NVIDIA H200" links=18`,
			devices: []string{`0 GPU-1234 00000000:3B:00.0 "NVIDIA H200" links=18`},
		},
		{
			name: "devices without keys get a uuid, a bus and 18 links from their index",
			in:   "device\ndevice",
			devices: []string{
				`0 GPU-00000000-0000-0000-0000-000000000000 00000000:01:00.0 "fakenvml GPU" links=18`,
				`1 GPU-00000000-0000-0000-0000-000000000001 00000000:02:00.0 "fakenvml GPU" links=18`,
			},
		},
		{
			name:    "pci addresses may have an 8-digit domain, no domain, or a function",
			in:      "device pci=00000001:AB:1f.0\ndevice pci=3c:00\ndevice pci=0000:3d:00.3 links=0",
			devices: []string{`0 GPU-00000000-0000-0000-0000-000000000000 00000001:AB:1F.0 "fakenvml GPU" links=18`, `1 GPU-00000000-0000-0000-0000-000000000001 00000000:3C:00.0 "fakenvml GPU" links=18`, `2 GPU-00000000-0000-0000-0000-000000000002 00000000:3D:00.3 "fakenvml GPU" links=0`},
		},
		{
			name: "comments, blank lines and CRLF endings are ignored",
			in:   "# a comment\n\n   \t\n  # indented comment\r\ndevice uuid=GPU-x # trailing comment\r\n",
			devices: []string{
				`0 GPU-x 00000000:01:00.0 "fakenvml GPU" links=18`,
			},
		},
		{
			name:    "a quoted value holds spaces and a hash",
			in:      `device name="GPU #0 (test)"`,
			devices: []string{`0 GPU-00000000-0000-0000-0000-000000000000 00000000:01:00.0 "GPU #0 (test)" links=18`},
		},
		{
			name: "xid times are Go durations after init or absolute unix seconds",
			in: twoDevices + "xid device=0 code=79 at=2s\nxid device=1 code=48 at=@1700000000.25\n" +
				"xid device=0 code=31\nxid device=0 code=13 at=1m30.5s\nxid device=0 code=94 at=250\u00b5s\nxid device=0 code=95 at=@1700000000",
			ops: []string{
				"xid device=0 code=79 at=2s",
				"xid device=1 code=48 at=@1700000000.250000000",
				"xid device=0 code=31 at=0s",
				"xid device=0 code=13 at=1m30.5s",
				"xid device=0 code=94 at=250µs",
				"xid device=0 code=95 at=@1700000000.000000000",
			},
		},
		{
			name: "nvlink counters take names or numbers, ramps or values, and from= is at=",
			in: twoDevices + "nvlink device=0 link=3 counter=crc_flit rate=5000 from=2s for=10s\n" +
				"nvlink device=0 link=3 counter=2 rate=0.5\n" +
				"nvlink device=1 link=3 counter=replay value=100 at=0s\n" +
				"nvlink device=0 link=17 counter=ecc_data value=18446744073709551615 from=1h\n" +
				"nvlink device=0 link=0 counter=recovery rate=1 at=1s\nnvlink device=0 link=0 counter=crc_data value=0",
			ops: []string{
				"nvlink device=0 link=3 counter=2 rate=5000 from=2s for=10s",
				"nvlink device=0 link=3 counter=2 rate=0.5 from=0s for=forever",
				"nvlink device=1 link=3 counter=0 value=100 at=0s",
				"nvlink device=0 link=17 counter=4 value=18446744073709551615 at=1h0m0s",
				"nvlink device=0 link=0 counter=1 rate=1 from=1s for=forever",
				"nvlink device=0 link=0 counter=3 value=0 at=0s",
			},
		},
		{
			name: "link states and lost devices",
			in:   twoDevices + "linkstate device=0 link=3 state=down at=4s\nlinkstate device=1 link=0 state=up\nlost device=1 at=5s",
			ops: []string{
				"linkstate device=0 link=3 state=0 at=4s",
				"linkstate device=1 link=0 state=1 at=0s",
				"lost device=1 at=5s",
			},
		},
		{
			name: "fabric takes names or numbers, and a cluster as hex or short text",
			in: twoDevices +
				"fabric device=0 state=completed health=healthy status=success clique=7 mask=2 cluster=01234567-89ab-cdef-0123-456789ABCDEF at=0s\n" +
				"fabric device=1 state=2 health=limited_capacity status=15 cluster=\"my cluster\"\n" +
				"fabric device=1",
			ops: []string{
				"fabric device=0 state=3 health=1 status=0 clique=7 mask=2 cluster=0123456789abcdef0123456789abcdef at=0s",
				"fabric device=1 state=2 health=3 status=15 clique=0 mask=0 cluster=6d7920636c7573746572000000000000 at=0s",
				"fabric device=1 state=3 health=1 status=0 clique=0 mask=0 cluster=00000000000000000000000000000000 at=0s",
			},
		},
		{
			// The reason bits are nvml.h's nvmlClocksEventReason* values:
			// HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown
			// 0x40, HwPowerBrakeSlowdown 0x80, SwPowerCap 0x4.
			name: "clocks take reason names, none or a number, with SM clocks defaulting to 1980 MHz",
			in: twoDevices + "clocks device=0 reasons=hw_slowdown,sw_thermal sm=1410 at=2s\n" +
				"clocks device=0 reasons=hw_thermal,hw_power_brake,sw_power_cap\nclocks device=1 reasons=none sm=900 sm_max=1755\n" +
				"clocks device=1 reasons=1024\nclocks device=1",
			ops: []string{
				"clocks device=0 reasons=0x28 sm=1410 sm_max=1980 at=2s",
				"clocks device=0 reasons=0xc4 sm=1980 sm_max=1980 at=0s",
				"clocks device=1 reasons=0x0 sm=900 sm_max=1755 at=0s",
				"clocks device=1 reasons=0x400 sm=1980 sm_max=1980 at=0s",
				"clocks device=1 reasons=0x0 sm=1980 sm_max=1980 at=0s",
			},
		},
		{
			name: "pcie defaults to gen 5 x16 everywhere; replays and ECC are counters without a link",
			in: twoDevices + "pcie device=0 gen=4 width=8 at=3s\npcie device=1 max_gen=4 gpu_max_gen=5 max_width=16\n" +
				"pcireplay device=0 rate=2.5 from=1s for=10s\npcireplay device=1 value=7\necc device=0 value=3 at=4s\necc device=1 rate=1",
			ops: []string{
				"pcie device=0 gen=4 width=8 max_gen=5 max_width=16 gpu_max_gen=5 at=3s",
				"pcie device=1 gen=5 width=16 max_gen=4 max_width=16 gpu_max_gen=5 at=0s",
				"pcireplay device=0 counter=0 rate=2.5 from=1s for=10s",
				"pcireplay device=1 counter=0 value=7 at=0s",
				"ecc device=0 counter=0 value=3 at=4s",
				"ecc device=1 counter=0 rate=1 from=0s for=forever",
			},
		},
		{
			name: "utilization, row remapping, retired pages, temperatures and NVLink speeds",
			in: twoDevices + "util device=0 gpu=97 memory=40 at=1s\nutil device=1\n" +
				"remap device=0 corr=2 uncorr=1 pending=yes failure=false at=5s\nremap device=1 failure=1\n" +
				"retired device=1 pending=true\ntemp device=0 gpu=86 slowdown=88 at=2s\ntemp device=1\n" +
				"nvlinkspeed device=0 link=17 mbps=13281 at=1s",
			ops: []string{
				"util device=0 gpu=97 memory=40 at=1s",
				"util device=1 gpu=0 memory=0 at=0s",
				"remap device=0 corr=2 uncorr=1 pending=1 failure=0 at=5s",
				"remap device=1 corr=0 uncorr=0 pending=0 failure=1 at=0s",
				"retired device=1 pending=1 at=0s",
				"temp device=0 gpu=86 slowdown=88 shutdown=95 at=2s",
				"temp device=1 gpu=40 slowdown=90 shutdown=95 at=0s",
				"nvlinkspeed device=0 link=17 mbps=13281 at=1s",
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			p := parse([]byte(tc.in))
			g.Expect(p.firstError).To(BeEmpty())
			g.Expect(p.errors).To(Equal(0))
			g.Expect(p.directives).To(Equal(len(tc.devices) + len(tc.ops) + strings.Count(tc.in, twoDevices)*2))
			if tc.devices != nil {
				g.Expect(p.devices).To(Equal(tc.devices))
			}
			g.Expect(p.ops).To(Equal(tc.ops))
		})
	}
}

func TestParseMalformed(t *testing.T) {
	cases := []struct {
		name string
		line string
		// want is a part of the reason the parser gives.
		want string
	}{
		{name: "an unknown directive", line: "reboot device=0", want: "unknown directive reboot"},
		{name: "a directive in capitals", line: "XID device=0 code=1", want: "unknown directive"},
		{name: "a directive glued to a key", line: "xid,device=0", want: "unknown directive"},
		{name: "a key without a value", line: "xid device", want: "want key=value after xid"},
		{name: "a key in capitals", line: "xid Device=0", want: "want key=value"},
		{name: "a key that is too long", line: "xid abcdefghijklmnopq=1", want: "key too long"},
		{name: "an unterminated quote", line: `device name="H200`, want: "unterminated quote in name="},
		{name: "text after a closing quote", line: `device name="H"200`, want: "text after the closing quote"},
		{name: "a quote inside a bare value", line: `device name=H"200"`, want: "stray quote"},
		{name: "a duplicate key", line: "xid device=0 device=1 code=1", want: "duplicate key device="},
		{name: "a key the directive does not take", line: "xid device=0 code=1 colour=red", want: "unexpected key colour= for xid"},
		{name: "for= on a counter value", line: "nvlink device=0 link=1 counter=replay value=1 for=2s", want: "unexpected key for= for nvlink"},
		{name: "a missing device", line: "xid code=79", want: "missing device="},
		{name: "a missing code", line: "xid device=0", want: "missing code="},
		{name: "a missing link", line: "linkstate device=0 state=down", want: "missing link="},
		{name: "a missing counter", line: "nvlink device=0 link=1 rate=1", want: "missing counter="},
		{name: "a missing state", line: "linkstate device=0 link=1", want: "missing state="},
		{name: "an unknown clocks reason", line: "clocks device=0 reasons=hw_slowdown,too_hot", want: "unknown reason too_hot"},
		{name: "a trailing comma in reasons", line: "clocks device=0 reasons=hw_slowdown,", want: "trailing comma"},
		{name: "a PCIe width past x64", line: "pcie device=0 width=65", want: "width=65: want an integer from 0 to 64"},
		{name: "a utilization over 100%", line: "util device=0 gpu=101", want: "gpu=101"},
		{name: "a remap flag that is not a boolean", line: "remap device=0 pending=maybe", want: "pending=maybe: want yes, no"},
		{name: "retired pages without pending=", line: "retired device=0", want: "missing pending="},
		{name: "a replay counter with both rate and value", line: "pcireplay device=0 rate=1 value=2", want: "pcireplay needs exactly one of rate= and value="},
		{name: "an ECC counter with neither", line: "ecc device=0", want: "ecc needs exactly one of rate= and value="},
		{name: "a link on a PCIe counter", line: "pcireplay device=0 link=1 value=2", want: "unexpected key link= for pcireplay"},
		{name: "an NVLink speed without mbps=", line: "nvlinkspeed device=0 link=1", want: "missing mbps="},
		{name: "an NVLink speed on a link the device lacks", line: "nvlinkspeed device=0 link=18 mbps=1", want: "device 0 has 18 links"},
		{name: "a device that was not declared", line: "xid device=2 code=1", want: "no such device"},
		{name: "a negative device", line: "lost device=-1", want: "no such device"},
		{name: "a link the device does not have", line: "linkstate device=1 link=4 state=down", want: "device 1 has 4 links"},
		{name: "a code that is not a number", line: "xid device=0 code=abc", want: "code=abc"},
		{name: "a code over 32 bits", line: "xid device=0 code=4294967296", want: "code=4294967296"},
		{name: "a counter value over 64 bits", line: "nvlink device=0 link=0 counter=0 value=18446744073709551616", want: "value="},
		{name: "an unknown counter", line: "nvlink device=0 link=0 counter=crc rate=1", want: "counter=crc"},
		{name: "counter 5", line: "nvlink device=0 link=0 counter=5 rate=1", want: "counter=5"},
		{name: "both rate and value", line: "nvlink device=0 link=0 counter=0 rate=1 value=1", want: "exactly one of rate= and value="},
		{name: "neither rate nor value", line: "nvlink device=0 link=0 counter=0", want: "exactly one of rate= and value="},
		{name: "a negative rate", line: "nvlink device=0 link=0 counter=0 rate=-1", want: "rate:"},
		{name: "a rate with an exponent", line: "nvlink device=0 link=0 counter=0 rate=1e3", want: "rate:"},
		{name: "an absurd rate", line: "nvlink device=0 link=0 counter=0 rate=10000000000000", want: "rate:"},
		{name: "a bad ramp length", line: "nvlink device=0 link=0 counter=0 rate=1 for=soon", want: "for=soon"},
		{name: "a duration without a unit", line: "xid device=0 code=1 at=5", want: "time 5"},
		{name: "a negative duration", line: "xid device=0 code=1 at=-1s", want: "time -1s"},
		{name: "a duration with an unknown unit", line: "xid device=0 code=1 at=2d", want: "time 2d"},
		{name: "a duration of a million hours", line: "xid device=0 code=1 at=1000000h", want: "time 1000000h"},
		{name: "an empty time", line: "xid device=0 code=1 at=", want: "time "},
		{name: "an absolute time that is not a number", line: "xid device=0 code=1 at=@abc", want: "time @abc"},
		{name: "an absolute time past 2096", line: "xid device=0 code=1 at=@99999999999", want: "time @99999999999"},
		{name: "an absolute time with junk", line: "xid device=0 code=1 at=@17.5s", want: "time @17.5s"},
		{name: "both at= and from=", line: "lost device=0 at=1s from=2s", want: "at= and from= are the same key"},
		{name: "a link state that is neither up nor down", line: "linkstate device=0 link=0 state=sideways", want: "state=sideways"},
		{name: "an unknown fabric state", line: "fabric device=0 state=done", want: "state=done"},
		{name: "fabric state 4", line: "fabric device=0 state=4", want: "state=4"},
		{name: "an unknown fabric health", line: "fabric device=0 health=ok", want: "health=ok"},
		{name: "an unknown fabric status", line: "fabric device=0 status=fine", want: "status=fine"},
		{name: "a clique over 32 bits", line: "fabric device=0 clique=4294967296", want: "clique="},
		{name: "a mask that is not a number", line: "fabric device=0 mask=x", want: "mask="},
		{name: "a cluster that is too long", line: "fabric device=0 cluster=this-is-far-too-long", want: "cluster="},
		{name: "a device index out of order", line: "device index=5", want: "index=5: devices must be numbered"},
		{name: "a duplicate uuid", line: "device uuid=GPU-a", want: "already has uuid GPU-a"},
		{name: "a duplicate pci address", line: "device pci=3b:00.0", want: "already has that pci address"},
		{name: "a bad pci address", line: "device pci=0000:3g:00.0", want: "pci=0000:3g:00.0"},
		{name: "a pci device number over 31", line: "device pci=0000:3b:20.0", want: "pci="},
		{name: "a pci function over 7", line: "device pci=0000:3b:00.8", want: "pci="},
		{name: "a pci address with four parts", line: "device pci=0:0:3b:00.0", want: "pci="},
		{name: "an empty uuid", line: "device uuid=", want: "uuid= must be"},
		{name: "a uuid over 95 bytes", line: "device uuid=" + strings.Repeat("a", 96), want: "uuid= must be"},
		{name: "a value over 127 bytes", line: "device uuid=" + strings.Repeat("a", 128), want: "value of uuid= longer than 127"},
		{name: "37 links", line: "device links=37", want: "links=37"},
		{name: "a device key the directive does not take", line: "device serial=1", want: "unexpected key serial= for device"},
		{name: "more than 16 keys", line: "fabric" + manyKeys(17), want: "more than 16 keys"},
		{name: "a line over 1024 bytes", line: "# " + strings.Repeat("x", 1024), want: "line longer than 1024 bytes"},
		{name: "a NUL byte", line: "xid device=0\x00 code=1", want: "NUL byte"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			// The bad line sits between good ones: only it is rejected.
			in := twoDevices + tc.line + "\nxid device=0 code=79\n"
			p := parse([]byte(in))
			g.Expect(p.errors).To(Equal(1))
			g.Expect(p.directives).To(Equal(3))
			g.Expect(p.firstError).To(HavePrefix("line 3: "))
			g.Expect(p.firstError).To(ContainSubstring(tc.want))
		})
	}
}

// manyKeys returns n distinct keys: " a=1 b=1 ...".
func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(" " + string(rune('a'+i)) + "=1")
	}
	return b.String()
}

func TestParseLimits(t *testing.T) {
	t.Run("a 65th device is rejected", func(t *testing.T) {
		g := NewWithT(t)
		p := parse([]byte(strings.Repeat("device\n", 65)))
		g.Expect(p.directives).To(Equal(64))
		g.Expect(p.errors).To(Equal(1))
		g.Expect(p.firstError).To(Equal("line 65: more than 64 devices"))
	})
	t.Run("directives past 65536 are rejected", func(t *testing.T) {
		g := NewWithT(t)
		p := parse([]byte("device\n" + strings.Repeat("lost device=0\n", 65538)))
		g.Expect(p.directives).To(Equal(65537))
		g.Expect(p.errors).To(Equal(2))
		g.Expect(p.firstError).To(Equal("line 65538: more than 65536 directives"))
	})
	t.Run("every bad line is counted", func(t *testing.T) {
		g := NewWithT(t)
		directives, errors := ParseScenario([]byte("device\nbad\nxid\nxid device=0 code=1\nlost device=3\n"))
		g.Expect(directives).To(Equal(2))
		g.Expect(errors).To(Equal(3))
	})
}

func TestParseGrowingFile(t *testing.T) {
	in := []byte(twoDevices + "xid device=0 code=79 at=2s\n# " + strings.Repeat("x", 3000) + "\nlost device=1\nfabric device=0")
	wantDirectives, wantErrors := ParseScenario(in)
	for split := 0; split <= len(in); split++ {
		directives, errors := parseInTwo(in, split)
		if directives != wantDirectives || errors != wantErrors {
			t.Fatalf("split at %d: got %d directives and %d errors, want %d and %d",
				split, directives, errors, wantDirectives, wantErrors)
		}
	}
}

func FuzzParseScenario(f *testing.F) {
	seeds := []string{
		"",
		"# comment only\n",
		twoDevices,
		`device index=0 uuid=GPU-1234 pci=0000:3b:00.0 name="NVIDIA H200" links=18`,
		twoDevices + "xid device=0 code=79 at=2s\nxid device=1 code=48 at=@1700000000.25\n",
		twoDevices + "nvlink device=0 link=3 counter=crc_flit rate=5000 from=2s for=10s\nnvlink device=0 link=3 counter=2 value=100 at=1m30.5s\n",
		twoDevices + "linkstate device=0 link=3 state=down at=4s\nlost device=1 at=5s\n",
		twoDevices + "fabric device=0 state=completed health=healthy status=success clique=7 cluster=01234567-89ab-cdef-0123-456789abcdef at=0s\n",
		"device name=\"unterminated\nxid device=0 code=\x00\r\n",
		"device pci=ffffffff:ff:1f.7\ndevice pci=0:0\n",
		"xid device=0 code=1 at=1h2m3s4ms5us6ns7\u00b5s\n",
		twoDevices + "clocks device=0 reasons=hw_slowdown,sw_thermal sm=1410 at=2s\nclocks device=1 reasons=1024\npcie device=0 gen=4 width=8 max_gen=5\n",
		twoDevices + "pcireplay device=0 rate=2.5 for=10s\necc device=1 value=3\nutil device=0 gpu=97\nremap device=0 pending=yes failure=0\n",
		twoDevices + "retired device=1 pending=true\ntemp device=0 gpu=86 slowdown=88\nnvlinkspeed device=0 link=2 mbps=13281\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		directives, errors := ParseScenario(data)
		lines := bytes.Count(data, []byte("\n")) + 1
		if directives < 0 || errors < 0 || directives+errors > lines {
			t.Fatalf("%d directives and %d errors from %d lines", directives, errors, lines)
		}
		// Reading the file in two goes, as the library does while it grows,
		// must come to the same counts as reading it at once.
		at := int(split) % (len(data) + 1)
		d2, e2 := parseInTwo(data, at)
		if d2 != directives || e2 != errors {
			t.Fatalf("split at %d: %d directives and %d errors, at once %d and %d", at, d2, e2, directives, errors)
		}
		if p := parse(data); p.errors > 0 && p.firstError == "" {
			t.Fatalf("%d errors but no message", p.errors)
		}
	})
}
