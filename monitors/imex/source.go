package imex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// ComputeDomainLabel is the node label NVIDIA's DRA driver sets (to the
// ComputeDomain's UID) on the nodes of a ComputeDomain. IMEX is only judged
// on those nodes: elsewhere an IMEX daemon that is not running is normal.
const ComputeDomainLabel = "resource.nvidia.com/computeDomain"

// Defaults for the Source fields left zero.
const (
	// DefaultCommand is the IMEX control tool, looked up in PATH.
	DefaultCommand = "nvidia-imex-ctl"
	// DefaultPort is the IMEX daemon's command port (IMEX_CMD_PORT).
	DefaultPort = 50005
	// DefaultInterval is how often the probes run. 30 s matches DCGM's IMEX
	// field refresh; an IMEX outage lasts minutes, not seconds.
	DefaultInterval = 30 * time.Second
	// DefaultTimeout bounds one run of nvidia-imex-ctl. A healthy daemon
	// answers in milliseconds; one that does not answer in 10 s is reported
	// as TIMEOUT.
	DefaultTimeout = 10 * time.Second
	// DefaultRepeatInterval is how often a condition that stays bad is
	// reported again, so that its NodeHealthEvent's lastSeen moves and a
	// reader can tell "still bad" from "stopped looking".
	DefaultRepeatInterval = 5 * time.Minute
)

// Codes of daemon findings that are not a state word printed by the daemon.
const (
	// CodeExecError is a daemon probe that failed: nvidia-imex-ctl could not
	// start, or exited non-zero without printing a state.
	CodeExecError = "EXEC_ERROR"
	// CodeTimeout is a daemon probe that did not finish within Timeout.
	CodeTimeout = "TIMEOUT"
)

// Component ids of IMEX findings.
const (
	componentDaemon = "daemon"
	componentDomain = "domain"
)

// Limits on what a run may print: a domain of 18 nodes (an NVL72 rack) is a
// few kilobytes of JSON, so more than 1 MiB is broken output.
const (
	maxOutput    = 1 << 20
	maxErrOutput = 256
	// waitDelay bounds the wait for the output pipes after nvidia-imex-ctl
	// exits or is killed, in case a child of it still holds them open.
	waitDelay = time.Second
)

// defaultDaemonArgs and defaultDomainArgs are the probes' arguments.
var (
	defaultDaemonArgs = []string{"-q"}
	defaultDomainArgs = []string{"-N", "-j"}
)

// Source runs nvidia-imex-ctl on nodes that carry ComputeDomainLabel and
// reports the IMEX daemon and the IMEX domain when they go bad.
//
// Each tick (every Interval, and once at start) it reads the node's labels.
// Without the label it runs nothing; when the label disappears it resolves
// every IMEX finding it raised. With the label it runs two probes:
//
//   - Daemon (DaemonArgs, default "-q"): any state but READY is a finding:
//     Check IMEXDaemon, Component IMEX "daemon", Code the state word
//     (UNAVAILABLE, INITIALIZING, …), or EXEC_ERROR when the command failed
//     without printing a state, or TIMEOUT; Severity Degraded, Action
//     Recertify. The GPUs work, but multi-node jobs of the ComputeDomain
//     cannot share memory through this node. The DRA driver restarts its
//     daemon by itself, and recertification proves the path afterwards;
//     nothing about the daemon calls for a GPU reset or a reboot.
//   - Domain (DomainArgs, default "-N -j"): DOWN is Check IMEXDomain,
//     Component IMEX "domain", Code DOWN, Severity Fatal, Action Recertify;
//     DEGRADED is Code DEGRADED, Severity Degraded, Action Recertify. The
//     domain spans nodes, so a bad domain is not proof that this node is
//     the broken one: the operator judges it across the clique.
//
// A finding is reported when its condition starts, again at most every
// RepeatInterval while it lasts, and once as Resolved (same source, check,
// component and code) when the probe sees the condition end or the node
// leaves the ComputeDomain. A probe whose output cannot be read (or, for the
// domain, that fails to run) changes nothing: it is counted and logged, and
// the open findings stay open, because "unknown" is not "recovered". When Run
// returns it resolves nothing: the agent is stopping, not the condition.
type Source struct {
	// Command is the nvidia-imex-ctl binary: a path, or a name looked up in
	// PATH once at start. Empty means DefaultCommand.
	Command string
	// DaemonArgs are the arguments of the daemon probe; nil means "-q".
	DaemonArgs []string
	// DomainArgs are the arguments of the domain probe; nil means "-N -j".
	// nvidia-imex-ctl reads the domain's node list from the daemon's config
	// file (-c, default /etc/nvidia-imex/config.cfg); the DRA driver's
	// daemon keeps it at /imexd/imexd.cfg inside its pod.
	DomainArgs []string
	// Address, when set, targets a daemon over its command port: both
	// probes get "-i <Address> <Port>" appended. Empty means nvidia-imex-ctl's
	// default (the local daemon, through its config file).
	Address string
	// Port is the daemon's command port used with Address; zero means
	// DefaultPort.
	Port int
	// Interval is the time between ticks; zero means DefaultInterval.
	Interval time.Duration
	// Timeout bounds one run of nvidia-imex-ctl; zero means DefaultTimeout.
	Timeout time.Duration
	// RepeatInterval is the least time between two reports of a condition
	// that stays bad; zero means DefaultRepeatInterval.
	RepeatInterval time.Duration
	// NodeLabels returns the labels of the agent's own Node; the agent
	// wires it to a cached read. Required. When it fails the tick does
	// nothing (the failure is logged).
	NodeLabels func(ctx context.Context) (map[string]string, error)
	// Clock gives the time of findings and of repeats; nil means the real
	// clock. Ticks follow the real clock.
	Clock clock.PassiveClock
}

// Name returns "imex".
func (s *Source) Name() string { return string(gpuhealthv1alpha1.SourceIMEX) }

var _ monitors.Source = &Source{}

// Run probes IMEX until ctx is done. It returns an error wrapping
// monitors.ErrUnavailable when Command is not found, and an error when
// NodeLabels is nil.
func (s *Source) Run(ctx context.Context, report monitors.Reporter) error {
	if s.NodeLabels == nil {
		return errors.New("imex source: NodeLabels is required")
	}
	command := s.Command
	if command == "" {
		command = DefaultCommand
	}
	path, err := exec.LookPath(command)
	if err != nil {
		return monitors.Unavailable("finding %s: %v", command, err)
	}
	r := &run{
		src:     s,
		log:     ctrllog.FromContext(ctx).WithValues("source", s.Name()),
		report:  report,
		path:    path,
		clock:   s.Clock,
		timeout: durationOr(s.Timeout, DefaultTimeout),
		repeat:  durationOr(s.RepeatInterval, DefaultRepeatInterval),
		open:    map[monitors.Key]raised{},
	}
	if r.clock == nil {
		r.clock = clock.RealClock{}
	}
	r.daemonArgs = r.args(s.DaemonArgs, defaultDaemonArgs)
	r.domainArgs = r.args(s.DomainArgs, defaultDomainArgs)

	ticker := time.NewTicker(durationOr(s.Interval, DefaultInterval))
	defer ticker.Stop()
	for {
		r.tick(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// raised is an open finding and when it was last reported.
type raised struct {
	finding  monitors.Finding
	reported time.Time
}

// run is the state of one Run.
type run struct {
	src        *Source
	log        logr.Logger
	report     monitors.Reporter
	path       string
	clock      clock.PassiveClock
	timeout    time.Duration
	repeat     time.Duration
	daemonArgs []string
	domainArgs []string

	// member is true while the node carries ComputeDomainLabel (as of the
	// last successful label read).
	member bool
	// open holds the findings raised and not resolved, by key.
	open map[monitors.Key]raised
}

// args returns the arguments of a probe: the configured ones (or the
// defaults when nil), plus the target when Address is set.
func (r *run) args(configured, defaults []string) []string {
	if configured == nil {
		configured = defaults
	}
	out := append([]string(nil), configured...)
	if r.src.Address != "" {
		port := r.src.Port
		if port == 0 {
			port = DefaultPort
		}
		out = append(out, "-i", r.src.Address, strconv.Itoa(port))
	}
	return out
}

// tick checks membership and, for a member, runs both probes.
func (r *run) tick(ctx context.Context) {
	labels, err := r.src.NodeLabels(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Error(err, "Reading node labels failed; skipping IMEX checks this time")
		}
		return
	}
	_, member := labels[ComputeDomainLabel]
	switch {
	case member && !r.member:
		r.log.Info("Node is in a ComputeDomain; starting IMEX checks")
	case !member && r.member:
		r.log.Info("Node left its ComputeDomain; stopping IMEX checks", "resolved", len(r.open))
		r.resolveAll("node left its ComputeDomain")
	}
	r.member = member
	if !member {
		return
	}
	r.checkDaemon(ctx)
	r.checkDomain(ctx)
}

// checkDaemon runs the daemon probe and raises or resolves its finding.
func (r *run) checkDaemon(ctx context.Context) {
	out, err := r.exec(ctx, r.daemonArgs)
	if ctx.Err() != nil {
		return
	}
	var code, msg string
	switch {
	case errors.Is(err, ErrMalformed):
		runs.WithLabelValues(resultMalformed).Inc()
		r.log.Error(err, "Skipping IMEX daemon status that cannot be read")
		return
	case errors.Is(err, errTimeout):
		runs.WithLabelValues(resultError).Inc()
		code, msg = CodeTimeout, fmt.Sprintf("nvidia-imex-ctl %s did not answer within %s", strings.Join(r.daemonArgs, " "), r.timeout)
	case err != nil:
		runs.WithLabelValues(resultError).Inc()
		r.log.V(1).Info("IMEX daemon probe failed", "err", err)
		// A state printed before a non-zero exit says more than the exit.
		if state, perr := ParseDaemonStatus(out); perr == nil && state != DaemonReady {
			code, msg = state, fmt.Sprintf("IMEX daemon is %s (%v)", state, err)
		} else {
			code, msg = CodeExecError, fmt.Sprintf("IMEX daemon probe failed: %v", err)
		}
	default:
		state, perr := ParseDaemonStatus(out)
		if perr != nil {
			runs.WithLabelValues(resultMalformed).Inc()
			r.log.Error(perr, "Skipping IMEX daemon status that cannot be read")
			return
		}
		runs.WithLabelValues(resultOK).Inc()
		if state == DaemonReady {
			r.observe(gpuhealthv1alpha1.CheckIMEXDaemon, nil, "IMEX daemon is READY")
			return
		}
		code, msg = state, fmt.Sprintf("IMEX daemon is %s, not READY", state)
	}
	r.observe(gpuhealthv1alpha1.CheckIMEXDaemon, &monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceIMEX,
		Check:     gpuhealthv1alpha1.CheckIMEXDaemon,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: componentDaemon},
		Code:      code,
		Severity:  gpuhealthv1alpha1.SeverityDegraded,
		Action:    gpuhealthv1alpha1.ActionRecertify,
		Message:   msg,
	}, "")
}

// checkDomain runs the domain probe and raises or resolves its finding.
func (r *run) checkDomain(ctx context.Context) {
	out, err := r.exec(ctx, r.domainArgs)
	if ctx.Err() != nil {
		return
	}
	if err != nil && !errors.Is(err, ErrMalformed) {
		// The daemon probe reports a daemon that does not answer; the
		// domain's state is unknown, which is not a change.
		runs.WithLabelValues(resultError).Inc()
		r.log.V(1).Info("IMEX domain probe failed", "err", err)
		return
	}
	d, perr := ParseDomainStatus(out)
	if err = errors.Join(err, perr); err != nil {
		runs.WithLabelValues(resultMalformed).Inc()
		r.log.Error(err, "Skipping IMEX domain status that cannot be read")
		return
	}
	runs.WithLabelValues(resultOK).Inc()
	f := &monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceIMEX,
		Check:     gpuhealthv1alpha1.CheckIMEXDomain,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: componentDomain},
		Code:      string(d.State),
		Action:    gpuhealthv1alpha1.ActionRecertify,
		Message:   domainMessage(d),
	}
	switch d.State {
	case DomainDown:
		f.Severity = gpuhealthv1alpha1.SeverityFatal
	case DomainDegraded:
		f.Severity = gpuhealthv1alpha1.SeverityDegraded
	default:
		f = nil
	}
	r.observe(gpuhealthv1alpha1.CheckIMEXDomain, f, domainMessage(d))
}

// observe records a check's current condition: bad is the finding it calls
// for, or nil when the check is healthy. It raises a new condition, repeats a
// lasting one every RepeatInterval, and resolves the check's other open
// findings (a different code is a different condition) with resolvedMsg,
// or with a note of the new code.
func (r *run) observe(check gpuhealthv1alpha1.Check, bad *monitors.Finding, resolvedMsg string) {
	now := r.clock.Now()
	for k, o := range r.open {
		if o.finding.Check != check || (bad != nil && k == bad.Key()) {
			continue
		}
		msg := resolvedMsg
		if bad != nil {
			msg = fmt.Sprintf("now %s", bad.Code)
		}
		r.resolve(k, o, msg, now)
	}
	if bad == nil {
		return
	}
	bad.Time = now
	k := bad.Key()
	if o, ok := r.open[k]; ok && now.Sub(o.reported) < r.repeat {
		return
	}
	if _, ok := r.open[k]; !ok {
		r.log.Info("IMEX condition started", "finding", bad.String(), "message", bad.Message)
	}
	r.open[k] = raised{finding: *bad, reported: now}
	r.report(*bad)
}

// resolveAll resolves every open finding.
func (r *run) resolveAll(msg string) {
	now := r.clock.Now()
	for k, o := range r.open {
		r.resolve(k, o, msg, now)
	}
}

// resolve reports an open finding resolved and forgets it.
func (r *run) resolve(k monitors.Key, o raised, msg string, now time.Time) {
	f := o.finding
	f.Resolved, f.Time, f.Message, f.Count = true, now, msg, 0
	delete(r.open, k)
	r.log.Info("IMEX condition ended", "finding", f.String(), "message", msg)
	r.report(f)
}

// domainMessage describes the domain with the numbers a human needs.
func domainMessage(d DomainStatus) string {
	msg := fmt.Sprintf("IMEX domain is %s", d.State)
	if len(d.Nodes) == 0 {
		return msg
	}
	msg += fmt.Sprintf(": %d of %d nodes ready", d.ReadyNodes(), len(d.Nodes))
	const maxListed = 8
	var notReady []string
	for _, n := range d.Nodes {
		if n.Ready() {
			continue
		}
		if len(notReady) == maxListed {
			notReady = append(notReady, "…")
			break
		}
		name := n.Host
		if n.HostName != "" {
			name = n.HostName
		}
		if name == "" {
			name = "node " + n.Index
		}
		status := n.Status
		if status == "" {
			status = "no status"
		}
		notReady = append(notReady, truncate(name)+" "+truncate(status))
	}
	if len(notReady) > 0 {
		msg += " (" + strings.Join(notReady, ", ") + ")"
	}
	return msg
}

// errTimeout marks a run of nvidia-imex-ctl that ran past Timeout.
var errTimeout = errors.New("nvidia-imex-ctl timed out")

// exec runs nvidia-imex-ctl with args and returns what it printed on
// standard output. The command inherits the agent's environment; neither it
// nor the output is logged, only a short piece of standard error on failure.
func (r *run) exec(ctx context.Context, args []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.path, args...)
	stdout := &cappedBuffer{max: maxOutput}
	stderr := &cappedBuffer{max: maxErrOutput}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = waitDelay
	err := cmd.Run()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return stdout.Bytes(), errTimeout
	}
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return stdout.Bytes(), fmt.Errorf("running nvidia-imex-ctl %s: %w: %q", strings.Join(args, " "), err, msg)
		}
		return stdout.Bytes(), fmt.Errorf("running nvidia-imex-ctl %s: %w", strings.Join(args, " "), err)
	}
	if stdout.truncated {
		return nil, fmt.Errorf("running nvidia-imex-ctl %s: %w: more than %d bytes of output", strings.Join(args, " "), ErrMalformed, maxOutput)
	}
	return stdout.Bytes(), nil
}

// cappedBuffer keeps the first max bytes written to it and drops the rest,
// so that a runaway command cannot exhaust the agent's memory.
type cappedBuffer struct {
	bytes.Buffer
	max       int
	truncated bool
}

// Write keeps what fits and reports everything written, so that the
// command is not killed by a broken pipe.
func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room < len(p) {
		b.truncated = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// durationOr returns d, or def when d is not positive.
func durationOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
