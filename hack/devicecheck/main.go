// Command devicecheck is the node agent's NVML checks run once, by hand, on
// a machine with real NVIDIA GPUs, as a pass/fail check that writes nothing
// to any apiserver. For the run's duration it
//
//   - reads every value the agent's checks read, straight through go-nvml,
//     once at the start and then every poll: the driver and each GPU's
//     inventory, fabric state, NVLink state, speed and error counters,
//     clocks event reasons, PCIe link and replays, remapped rows, retired
//     pages, ECC, temperatures and utilisation ("reading" lines);
//   - runs the agent's own NVML source (monitors/nvml.Source, and the DCGM
//     source when libdcgm is there) in-process, with a reporter that prints
//     each finding instead of publishing it ("finding" lines);
//   - times each NVML call it made itself ("timing" lines: count, min,
//     median, max per call).
//
// Everything goes to stdout as JSON Lines, one object per line with a
// "kind" field, ending with one "summary" line; a human-readable account
// goes to stderr. A healthy idle GPU makes no finding, so the exit status
// is 0 only when no source made one. Exit statuses: 0 pass; 1 a finding
// was made or a source failed; 2 NVML could not be initialised (no driver,
// or libnvidia-ml.so.1 not in the loader path); 3 a bad flag or
// configuration file.
//
// It calls only NVML functions the agent calls, and the ones newer than the
// oldest supported driver (nvml.OptionalSymbols) only after looking them up,
// as the agent does, so it runs on every driver the agent runs on.
//
//	bash hack/device-check.sh                            build, run 60 s, keep the output
//	go run ./hack/devicecheck --duration 20s --poll 2s > check.jsonl
//
// See /tmp/devicecheck-doc.md for the format.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Exit statuses.
const (
	exitPass = 0
	// exitFail: a source made a finding, a source failed, or DCGM was
	// required (--dcgm=on) and did not run.
	exitFail = 1
	// exitNoNVML: nvmlInit failed; nothing was read.
	exitNoNVML = 2
	// exitUsage: a bad flag or configuration file.
	exitUsage = 3
)

// DCGM modes (--dcgm).
const (
	dcgmAuto = "auto"
	dcgmOn   = "on"
	dcgmOff  = "off"
)

// options are the command's flags.
type options struct {
	// duration is how long the sources run and readings are taken.
	duration time.Duration
	// poll is how often the readings are taken and the sources poll; zero
	// means the configuration's nvml.pollInterval, else the agent's
	// default (nvml.DefaultPollInterval, 10 s).
	poll time.Duration
	// library is libnvidia-ml.so.1's path; empty means the configuration's
	// nvml.libraryPath, else the dynamic loader's search path.
	library string
	// config is an agent configuration file (the monitor's --config);
	// empty means the agent's defaults.
	config string
	// dcgm is auto (run the DCGM source when libdcgm is there; a DCGM that
	// is absent or fails is reported, not failed), on (it must run) or off.
	dcgm string
	// pciScan compares NVML's GPUs with the PCI bus's, as the agent does
	// (the GPUMissing check); off for tests whose fake GPUs are not on the
	// bus.
	pciScan bool
}

func main() { os.Exit(runMain()) }

// runMain runs the command and returns its exit status; an interrupt ends
// the run early, with its summary.
func runMain() int {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, o, os.Stdout, os.Stderr)
}

// parseFlags reads the command line; it has printed the problem to stderr
// when it returns an error.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("devicecheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.DurationVar(&o.duration, "duration", time.Minute, "How long to run the checks.")
	fs.DurationVar(&o.poll, "poll", 0, "How often to read and poll (default: the configuration's nvml.pollInterval, else 10s).")
	fs.StringVar(&o.library, "nvml-library", "", "Path of libnvidia-ml.so.1 (default: the configuration's nvml.libraryPath, else the loader's search path).")
	fs.StringVar(&o.config, "config", "", "The agent's configuration file (gpuhealth-monitor --config); default: the agent's defaults.")
	fs.StringVar(&o.dcgm, "dcgm", dcgmAuto, "DCGM source: auto (run it when libdcgm is there), on (it must run) or off.")
	fs.BoolVar(&o.pciScan, "pci-scan", true, "Compare NVML's GPUs with the PCI bus's (the agent's GPUMissing check).")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	switch {
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.duration <= 0:
		err = fmt.Errorf("--duration %s: must be positive", o.duration)
	case o.poll < 0:
		err = fmt.Errorf("--poll %s: must not be negative", o.poll)
	case o.dcgm != dcgmAuto && o.dcgm != dcgmOn && o.dcgm != dcgmOff:
		err = fmt.Errorf("--dcgm %q: want auto, on or off", o.dcgm)
	}
	if err != nil {
		fmt.Fprintln(stderr, "devicecheck:", err)
	}
	return o, err
}
