package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/agent"
	"github.com/gpuhealth/gpuhealth/monitors/dcgm"
	"github.com/gpuhealth/gpuhealth/monitors/nvml"
	"github.com/gpuhealth/gpuhealth/monitors/services"
)

// Results of a run (summaryLine.Result).
const (
	resultPass        = "pass"
	resultFail        = "fail"
	resultUnavailable = "nvml-unavailable"
)

// How a source ended (summaryLine.NVMLSource and DCGM).
const (
	sourceRan    = "ran"
	sourceOff    = "off"
	sourceNotRun = "not run"
)

// run runs the check and returns the exit status.
func run(ctx context.Context, o options, stdout, stderr io.Writer) int {
	out := newOutput(stdout, stderr)
	cfg, err := loadConfig(o.config)
	if err != nil {
		out.say("%v", err)
		return exitUsage
	}
	poll := o.poll
	if poll == 0 {
		poll = cfg.NVML.PollInterval.Duration
	}
	if poll <= 0 {
		poll = nvml.DefaultPollInterval
	}
	library := o.library
	if library == "" {
		library = cfg.NVML.LibraryPath
	}
	started := time.Now()
	sum := summaryLine{
		Kind: kindSummary, Started: started, Duration: o.duration.String(), PollInterval: poll.String(), Library: library,
		NVMLSource: sourceNotRun, DCGM: sourceNotRun,
	}
	var libOpts []gonvml.LibraryOption
	if library != "" {
		libOpts = append(libOpts, gonvml.WithLibraryPath(library))
	}
	c := &checker{lib: gonvml.New(libOpts...), times: timings{}}
	if ret := c.times.call("nvmlInit_v2", c.lib.Init); ret != gonvml.SUCCESS {
		why := c.lib.ErrorString(ret)
		sum.NVML = "cannot initialise: " + why
		sum.Result, sum.ExitStatus = resultUnavailable, exitNoNVML
		sum.Reasons = []string{"nvmlInit failed: " + why}
		out.say("NVML cannot be initialised: %s. Is the NVIDIA driver loaded, and is %s in the dynamic loader's path (ldconfig -p | grep libnvidia-ml)? Nothing was checked.",
			why, libraryName(library))
		c.finish(&sum, out, started)
		return exitNoNVML
	}
	sum.NVML = "ok"
	c.lookupSymbols()
	for _, err := range c.discover() {
		sum.Reasons = append(sum.Reasons, err.Error())
		out.say("Discovery: %v", err)
	}
	sum.GPUs = len(c.devices)

	findings := &collector{out: out}
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	nvDone := make(chan error, 1)
	nv := nvmlSource(cfg, library, poll, o.pciScan, out)
	go func() { nvDone <- nv.Run(runCtx, findings.report) }()
	var dcgmDone chan error
	sum.DCGM = sourceOff
	if o.dcgm != dcgmOff {
		dcgmDone = make(chan error, 1)
		src := dcgmSource(cfg, poll, out)
		go func() { dcgmDone <- src.Run(runCtx, findings.report) }()
	}

	// The readings: at once, then every poll until the duration is over.
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	var nvErr, dcgmErr error
	nvEnded, dcgmEnded := false, dcgmDone == nil
	// first are the GPUs' readings at the start, for the human account.
	first := map[int][]readingLine{}
	var driver driverValues
	polls := 0
rounds:
	for {
		c.readAll(polls, func(l readingLine) {
			out.emit(l)
			switch {
			case polls > 0:
			case l.GPU != nil:
				first[*l.GPU] = append(first[*l.GPU], l)
			default:
				driver, _ = l.Values.(driverValues)
				out.say("%s", describeDriver(driver))
			}
		})
		if polls == 0 {
			for _, d := range c.devices {
				out.say("%s", describeGPU(d, first[d.index]))
			}
		}
		polls++
		for waiting := true; waiting; {
			select {
			case <-runCtx.Done():
				break rounds
			case <-ticker.C:
				waiting = false
			case nvErr = <-nvDone:
				// The agent's source stopped before its time: what it
				// would find from here on is unknown, so stop.
				nvEnded, nvDone = true, nil
				if runCtx.Err() == nil {
					out.say("The nvml source stopped early: %v", nvErr)
				}
				cancel()
			case dcgmErr = <-dcgmDone:
				dcgmEnded, dcgmDone = true, nil
				out.say("dcgm: %s", dcgmStatus(dcgmErr))
			}
		}
	}
	cancel()
	if !nvEnded {
		nvErr = awaitStop(nvDone)
	}
	if !dcgmEnded {
		dcgmErr = awaitStop(dcgmDone)
	}
	sum.Polls = polls
	if ctx.Err() != nil {
		sum.Reasons = append(sum.Reasons, fmt.Sprintf("interrupted after %s of %s", time.Since(started).Round(time.Second), o.duration))
	}
	sum.Readings, sum.ReadErrors = c.readings, c.readErrors
	sum.NVMLSource = sourceRan
	if nvErr != nil {
		sum.NVMLSource = "failed: " + nvErr.Error()
		sum.Reasons = append(sum.Reasons, "the nvml source failed: "+nvErr.Error())
	}
	if o.dcgm != dcgmOff {
		sum.DCGM = dcgmStatus(dcgmErr)
		if o.dcgm == dcgmOn && dcgmErr != nil {
			sum.Reasons = append(sum.Reasons, "DCGM was required (--dcgm=on) and did not run: "+dcgmErr.Error())
		}
	}
	sum.Driver = driver.DriverInventory
	sum.Findings, sum.ResolvedFindings = findings.counts()
	if sum.Findings > 0 {
		sum.Reasons = append([]string{plural(sum.Findings, "finding", "findings") + " made"}, sum.Reasons...)
	}
	if ret := c.times.call("nvmlShutdown", c.lib.Shutdown); ret != gonvml.SUCCESS {
		out.say("nvmlShutdown: %s", c.lib.ErrorString(ret))
	}
	sum.Result, sum.ExitStatus = resultPass, exitPass
	if len(sum.Reasons) > 0 {
		sum.Result, sum.ExitStatus = resultFail, exitFail
	}
	c.finish(&sum, out, started)
	return sum.ExitStatus
}

// nvmlSource is the agent's NVML source as the agent builds it from its
// configuration (monitors/agent's buildSources), polling every poll.
func nvmlSource(cfg agent.Config, library string, poll time.Duration, pciScan bool, out *output) *nvml.Source {
	nv := &nvml.Source{
		LibraryPath:  library,
		PollInterval: poll,
		Window:       cfg.NVML.Window.Duration,
		Thresholds:   thresholds(cfg.NVML.Thresholds),
		FabricGrace:  cfg.NVML.FabricGrace.Duration,
		Performance:  cfg.NVML.Performance.Source(),
		Log:          logger(out, "nvml"),
	}
	if pciScan {
		root := cfg.Inventory.SysRoot
		if root == "" {
			root = services.DefaultSysRoot
		}
		nv.PCIGPUs = func() ([]string, error) {
			p, err := services.ScanPCI(root)
			return p.GPUs, err
		}
	}
	return nv
}

// dcgmSource is the agent's DCGM source as the agent builds it, polling
// every poll unless the configuration says otherwise.
func dcgmSource(cfg agent.Config, poll time.Duration, out *output) *dcgm.Source {
	dcgmPoll := cfg.DCGM.PollInterval.Duration
	if dcgmPoll <= 0 {
		dcgmPoll = poll
	}
	return &dcgm.Source{
		Mode: dcgm.Mode(cfg.DCGM.Mode), Address: cfg.DCGM.Address, PollInterval: dcgmPoll,
		Performance: cfg.DCGM.Performance.Source(), Log: logger(out, "dcgm"),
	}
}

// stopGrace is how long a source may take to return after the run ends:
// the NVML source's event wait returns within a second, and DCGM's
// connect does not take a context, so a source still running after this
// hangs and is reported instead of waited for.
const stopGrace = 10 * time.Second

// awaitStop waits for a source's Run to return.
func awaitStop(done <-chan error) error {
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("still running %s after the end of the run", stopGrace)
	}
}

// finish writes the timing lines and the summary, and says how it went.
func (c *checker) finish(sum *summaryLine, out *output, started time.Time) {
	lines, calls := c.times.lines()
	for _, l := range lines {
		out.emit(l)
	}
	elapsed := time.Since(started)
	sum.NVMLCalls = calls
	sum.Elapsed = elapsed.Round(time.Millisecond).String()
	out.emit(sum)
	if out.err != nil {
		out.say("Writing the JSON lines failed: %v", out.err)
		if sum.ExitStatus == exitPass {
			sum.ExitStatus = exitFail
		}
	}

	var b strings.Builder
	if sum.NVML == "ok" {
		fmt.Fprintf(&b, "devicecheck: %s of %s in %s (every %s): %d readings, %d failed calls in them\n",
			plural(sum.Polls, "poll", "polls"), plural(sum.GPUs, "GPU", "GPUs"), sum.Elapsed, sum.PollInterval, sum.Readings, sum.ReadErrors)
		fmt.Fprintf(&b, "devicecheck: nvml source: %s; dcgm: %s\n", sum.NVMLSource, sum.DCGM)
		fmt.Fprintf(&b, "devicecheck: %s, %s resolved\n", plural(sum.Findings, "finding", "findings"), plural(sum.ResolvedFindings, "finding", "findings"))
	}
	fmt.Fprintf(&b, "devicecheck: this command's own NVML calls, %d in all:\n", calls)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  call\tcount\tfailed\tmin\tmedian\tmax\t")
	for _, l := range lines {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\t%s\t%s\t\n", l.Call, l.Count, l.Failed,
			time.Duration(l.MinNs), time.Duration(l.MedianNs), time.Duration(l.MaxNs))
	}
	_ = tw.Flush()
	switch sum.Result {
	case resultPass:
		fmt.Fprintf(&b, "devicecheck: PASS: no finding in %s\n", sum.Duration)
	case resultFail:
		fmt.Fprintf(&b, "devicecheck: FAIL (exit status %d): %s\n", sum.ExitStatus, strings.Join(sum.Reasons, "; "))
	default:
		fmt.Fprintf(&b, "devicecheck: NVML UNAVAILABLE (exit status %d): %s\n", sum.ExitStatus, sum.NVML)
	}
	out.sayRaw(b.String())
}

// collector prints the findings the sources report instead of publishing
// them.
type collector struct {
	out                *output
	mu                 sync.Mutex
	findings, resolved int
}

func (k *collector) report(f monitors.Finding) {
	line := findingLine{
		Kind: kindFinding, Time: f.Time, Source: f.Source, Check: f.Check, Component: f.Component, Code: f.Code,
		Severity: f.Severity, Action: f.Action, Message: f.Message, Resolved: f.Resolved, Count: f.Count,
	}
	if line.Time.IsZero() {
		line.Time = time.Now()
	}
	// The sources leave an XID's verdict to the pipeline, which takes it
	// from the catalog.
	if f.Check == gpuhealthv1alpha1.CheckXID && f.Severity == "" {
		if code, err := strconv.Atoi(f.Code); err == nil {
			e := xid.Lookup(code, f.Message)
			line.Severity, line.Action, line.ClassifiedBy = e.Severity, e.Action, "xid catalog"
			if line.Message == "" {
				line.Message = fmt.Sprintf("XID %d: %s; %s", code, e.Summary(), e.Reason)
			}
		}
	}
	k.mu.Lock()
	if f.Resolved {
		k.resolved++
	} else {
		k.findings++
	}
	k.mu.Unlock()
	k.out.emit(line)
	what := "FINDING"
	if f.Resolved {
		what = "resolved"
	}
	verdict := "severity and action left to the agent's per-check defaults"
	if line.Severity != "" || line.Action != "" {
		verdict = fmt.Sprintf("%s, %s", line.Severity, line.Action)
	}
	k.out.say("%s %s/%s %s %s (%s): %s", what, line.Source, line.Check, line.Component.ID, line.Code, verdict, line.Message)
}

func (k *collector) counts() (findings, resolved int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.findings, k.resolved
}

// loadConfig reads the agent's configuration file; no file is the agent's
// defaults.
func loadConfig(path string) (agent.Config, error) {
	if path == "" {
		return agent.Config{}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return agent.Config{}, fmt.Errorf("reading the agent configuration: %w", err)
	}
	return agent.ParseConfig(b)
}

// thresholds converts the configuration's NVLink thresholds as the agent
// does.
func thresholds(in map[string]float64) map[nvml.Counter]float64 {
	out := map[nvml.Counter]float64{}
	for k, v := range in {
		out[nvml.Counter(k)] = v
	}
	return out
}

// logger sends a source's logs to stderr.
func logger(out *output, name string) logr.Logger {
	return funcr.New(func(prefix, args string) { out.say("%s: %s", prefix, args) }, funcr.Options{}).WithName(name)
}

func dcgmStatus(err error) string {
	switch {
	case err == nil:
		return sourceRan
	case errors.Is(err, monitors.ErrUnavailable):
		return "not present: " + err.Error()
	default:
		return "failed: " + err.Error()
	}
}

func libraryName(path string) string {
	if path == "" {
		return "libnvidia-ml.so.1"
	}
	return path
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
