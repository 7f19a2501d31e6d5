package services

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// testBoot is the fake host's boot time (btime in its /proc/stat).
const testBoot = 1_790_000_000

// host is a fake host as the agent sees it: its /proc, its /usr/bin, sysfs
// and /etc/nvidia-imex, in a temporary directory.
type host struct {
	t                         *testing.T
	proc, bin, sys, imexNodes string
}

func newHost(t *testing.T) *host {
	t.Helper()
	root := t.TempDir()
	h := &host{
		t:         t,
		proc:      filepath.Join(root, "proc"),
		bin:       filepath.Join(root, "usr", "bin"),
		sys:       filepath.Join(root, "sys"),
		imexNodes: filepath.Join(root, "etc", "nvidia-imex", "nodes_config.cfg"),
	}
	for _, d := range []string{h.proc, h.bin, filepath.Join(h.sys, "bus", "pci", "devices")} {
		h.mkdir(d)
	}
	h.write(filepath.Join(h.proc, "stat"), fmt.Sprintf("cpu  1 2 3 4\nintr 5\nctxt 6\nbtime %d\nprocesses 7\n", testBoot))
	h.write(filepath.Join(h.proc, "self"), "not a process directory")
	h.start(1, "systemd", 1)
	return h
}

func (h *host) mkdir(dir string) {
	h.t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) write(path, content string) {
	h.t.Helper()
	h.mkdir(filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// statLine is a /proc/<pid>/stat line as the kernel writes it.
func statLine(pid int, comm string, state byte, start uint64) string {
	return fmt.Sprintf("%d (%s) %c 1 %d %d 0 -1 4194560 1200 0 3 0 50 20 0 0 20 0 4 0 %d 512000000 3000 18446744073709551615 1 1 0 0 0 0 0 4096 16384 0 0 0 17 3 0 0 0 0 0\n",
		pid, comm, state, pid, pid, start)
}

// start adds a running process; start is its start time in ticks after
// boot.
func (h *host) start(pid int, comm string, start uint64) {
	h.t.Helper()
	h.process(pid, comm, 'S', start)
}

// process adds a process in the given state.
func (h *host) process(pid int, comm string, state byte, start uint64) {
	h.t.Helper()
	dir := filepath.Join(h.proc, strconv.Itoa(pid))
	h.write(filepath.Join(dir, "comm"), comm+"\n")
	h.write(filepath.Join(dir, "stat"), statLine(pid, comm, state, start))
}

// stop removes a process.
func (h *host) stop(pid int) {
	h.t.Helper()
	if err := os.RemoveAll(filepath.Join(h.proc, strconv.Itoa(pid))); err != nil {
		h.t.Fatal(err)
	}
}

// install puts a daemon's binary in /usr/bin.
func (h *host) install(binary string) {
	h.t.Helper()
	h.write(filepath.Join(h.bin, binary), "#!/bin/sh\n")
}

// configureIMEX writes the host-managed IMEX daemon's nodes file.
func (h *host) configureIMEX() {
	h.t.Helper()
	h.write(h.imexNodes, "10.0.0.1\n10.0.0.2\n")
}

// pciDevice adds a PCI device with the given vendor and class files.
func (h *host) pciDevice(bus, vendor, class string) {
	h.t.Helper()
	dir := filepath.Join(h.sys, "bus", "pci", "devices", bus)
	h.write(filepath.Join(dir, "vendor"), vendor+"\n")
	h.write(filepath.Join(dir, "class"), class+"\n")
}

// hgx adds what an HGX H100 board shows: gpus GPUs and switches NVSwitches.
func (h *host) hgx(gpus, switches int) {
	h.t.Helper()
	for i := range gpus {
		h.pciDevice(fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10), pciVendorNVIDIA, "0x030200")
	}
	for i := range switches {
		h.pciDevice(fmt.Sprintf("0000:%02x:00.0", 0x05+i), pciVendorNVIDIA, "0x068000")
	}
}

// source is a Source reading the fake host.
func (h *host) source() *Source {
	return &Source{ProcRoot: h.proc, BinRoot: h.bin, SysRoot: h.sys, IMEXNodesConfig: h.imexNodes}
}
