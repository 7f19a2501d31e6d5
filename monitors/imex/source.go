package imex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/readiness"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Defaults for the Source fields left zero.
const (
	// DefaultCommand is the IMEX control tool's name, looked up in PATH
	// before DefaultCommandPaths.
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
	// DefaultStartupGrace is how long a daemon pod that is not Ready yet is
	// left alone after it started. A joining daemon reports states such as
	// WAITING_FOR_PEERS until its peers are up, which is normal; the
	// driver's own startup probe waits up to 20 minutes before it gives up,
	// and 10 minutes covers a rack whose trays join one after the other.
	DefaultStartupGrace = 10 * time.Minute
)

// DefaultCommandPaths are where the monitor DaemonSet mounts nvidia-imex-ctl
// from the host, tried in order after PATH: the GPU Operator's driver root
// (/run/nvidia/driver) and the host's /usr/bin (a host-installed driver or
// the nvidia-imex package), both read-only.
var DefaultCommandPaths = []string{
	"/run/nvidia/driver/usr/bin/nvidia-imex-ctl",
	"/host/usr/bin/nvidia-imex-ctl",
}

// Codes of daemon findings that are not a state word printed by the daemon.
const (
	// CodeExecError is a daemon probe that failed: nvidia-imex-ctl could not
	// start, or exited non-zero without printing a state (for example the
	// daemon's command port did not answer).
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

// Source checks the IMEX daemon of nodes that carry ComputeDomainLabel and
// reports the daemon and the IMEX domain when they go bad.
//
// Each tick (every Interval, and once at start) it reads the node's labels.
// Without the label it runs nothing; when the label disappears it resolves
// every IMEX finding it raised. With the label it finds the daemon:
//
//   - NVIDIA's DRA driver runs IMEX in a ComputeDomain daemon pod on the
//     node (label ComputeDomainLabel = the domain's UID, in the driver's
//     namespace), with its configuration inside the pod. The source finds
//     that pod through Pods and asks it over its command port:
//     "nvidia-imex-ctl -q -i <pod IP> <Port>". The domain status is not
//     asked: -N needs the daemon's configuration file, which only the pod
//     has; the operator judges the domain from the ComputeDomain's status.
//     A pod without an IP, or not Ready and started less than StartupGrace
//     ago, is left alone; a pod labelled with an empty CliqueLabel (no
//     NVLink fabric: the driver starts no IMEX daemon) is not judged.
//   - Without such a pod, a host-managed daemon can be configured: Address
//     ("-q -i <Address> <Port>") or ConfigFile ("-q -c <ConfigFile>", and
//     the domain with "-N -j -c <ConfigFile>").
//   - Otherwise IMEX is not judged, and the state says why.
//
// The probes:
//
//   - Daemon: any state but READY is a finding: Check IMEXDaemon, Component
//     IMEX "daemon", Code the state word (UNAVAILABLE, INITIALIZING, …), or
//     EXEC_ERROR when the command failed without printing a state, or
//     TIMEOUT; Severity Degraded, Action Recertify. The GPUs work, but
//     multi-node jobs of the ComputeDomain cannot share memory through this
//     node. The DRA driver restarts its daemon by itself, and
//     recertification proves the path afterwards; nothing about the daemon
//     calls for a GPU reset or a reboot.
//   - Domain (ConfigFile only): DOWN is Check IMEXDomain, Component IMEX
//     "domain", Code DOWN, Severity Fatal, Action Recertify; DEGRADED is
//     Code DEGRADED, Severity Degraded, Action Recertify. The domain spans
//     nodes, so a bad domain is not proof that this node is the broken one:
//     the operator judges it across the clique.
//
// nvidia-imex-ctl printing "Failed to read node configuration file" (it
// exits 255 where IMEX is not configured) is a state, not a fault: the
// source resolves what it raised and returns an error wrapping
// monitors.ErrUnavailable, so the agent shows it unavailable
// (gpuhealth_monitor_source_up 0), logs the reason and tries again later.
//
// A finding is reported when its condition starts, again at most every
// RepeatInterval while it lasts, and once as Resolved (same source, check,
// component and code) when the probe sees the condition end, the node
// leaves the ComputeDomain or IMEX is no longer judged there because the
// node has no NVLink clique. A probe whose output cannot be read (or, for
// the domain, that fails to run) changes nothing: it is counted and logged,
// and the open findings stay open, because "unknown" is not "recovered";
// so do a daemon pod that is gone or starting and pods that cannot be
// read. When Run returns because ctx is done it resolves nothing: the agent
// is stopping, not the condition.
//
// gpuhealth_monitor_imex_state tells which of these the source is in.
type Source struct {
	// Command is the nvidia-imex-ctl binary: a path, or a name looked up in
	// PATH, at each start. Empty means DefaultCommand in PATH, then
	// DefaultCommandPaths.
	Command string
	// NodeName is this node's name; daemon pods bound to other nodes are
	// ignored. Required when Pods is set.
	NodeName string
	// Pods lists the ComputeDomain daemon pods on this node; the agent wires
	// it to a PodWatch. Nil means no pod is looked up: only a host-managed
	// daemon (Address or ConfigFile) is checked.
	Pods DaemonPodLister
	// Port is the daemon's command port; zero means DefaultPort.
	Port int
	// Address targets a host-managed daemon's command service when the node
	// has no daemon pod. Set at most one of Address and ConfigFile.
	Address string
	// ConfigFile is a host-managed daemon's configuration file as the agent
	// sees it (mounted from the host's /etc/nvidia-imex), used when the node
	// has no daemon pod. With it the domain is checked too.
	ConfigFile string
	// Interval is the time between ticks; zero means DefaultInterval.
	Interval time.Duration
	// Timeout bounds one run of nvidia-imex-ctl; zero means DefaultTimeout.
	Timeout time.Duration
	// RepeatInterval is the least time between two reports of a condition
	// that stays bad; zero means DefaultRepeatInterval.
	RepeatInterval time.Duration
	// StartupGrace is how long a daemon pod that is not Ready is left alone
	// after it started; zero means DefaultStartupGrace, negative none.
	StartupGrace time.Duration
	// NodeLabels returns the labels of the agent's own Node; the agent
	// wires it to a cached read. Required. When it fails the tick does
	// nothing (the failure is logged).
	NodeLabels func(ctx context.Context) (map[string]string, error)
	// Clock gives the time of findings, of repeats and of the startup grace;
	// nil means the real clock. Ticks follow the real clock.
	Clock clock.PassiveClock
}

// Name returns "imex".
func (s *Source) Name() string { return string(gpuhealthv1alpha1.SourceIMEX) }

var _ monitors.Source = &Source{}

// Run probes IMEX until ctx is done. It returns an error wrapping
// monitors.ErrUnavailable when nvidia-imex-ctl is not found or says that
// IMEX is not configured on this node, and another error when the Source is
// misconfigured.
func (s *Source) Run(ctx context.Context, report monitors.Reporter) error {
	if err := s.validate(); err != nil {
		return err
	}
	path, err := findCommand(s.Command)
	if err != nil {
		setState(StateNoCommand)
		return monitors.Unavailable("%v", err)
	}
	r := &run{
		src:     s,
		log:     ctrllog.FromContext(ctx).WithValues("source", s.Name()),
		report:  report,
		path:    path,
		clock:   s.Clock,
		timeout: durationOr(s.Timeout, DefaultTimeout),
		repeat:  durationOr(s.RepeatInterval, DefaultRepeatInterval),
		grace:   s.StartupGrace,
		open:    map[monitors.Key]raised{},
	}
	if r.clock == nil {
		r.clock = clock.RealClock{}
	}
	if r.grace == 0 {
		r.grace = DefaultStartupGrace
	}
	if s.Pods != nil {
		s.Pods.Start(ctx)
	}

	ticker := time.NewTicker(durationOr(s.Interval, DefaultInterval))
	defer ticker.Stop()
	for {
		if err := r.tick(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// validate checks the fields that Run needs.
func (s *Source) validate() error {
	switch {
	case s.NodeLabels == nil:
		return errors.New("imex source: NodeLabels is required")
	case s.Pods != nil && s.NodeName == "":
		return errors.New("imex source: NodeName is required with Pods")
	case s.Address != "" && s.ConfigFile != "":
		return errors.New("imex source: set at most one of Address and ConfigFile (nvidia-imex-ctl takes one of -i and -c)")
	}
	return nil
}

// findCommand resolves the nvidia-imex-ctl binary.
func findCommand(command string) (string, error) {
	if command != "" {
		path, err := exec.LookPath(command)
		if err != nil {
			return "", fmt.Errorf("finding %s: %w", command, err)
		}
		return path, nil
	}
	if path, err := exec.LookPath(DefaultCommand); err == nil {
		return path, nil
	}
	for _, p := range DefaultCommandPaths {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("%s is neither in PATH nor at %s (mount the driver root, see config/monitor/daemonset.yaml, or set imex.command)",
		DefaultCommand, strings.Join(DefaultCommandPaths, ", "))
}

// raised is an open finding and when it was last reported.
type raised struct {
	finding  monitors.Finding
	reported time.Time
}

// run is the state of one Run.
type run struct {
	src     *Source
	log     logr.Logger
	report  monitors.Reporter
	path    string
	clock   clock.PassiveClock
	timeout time.Duration
	repeat  time.Duration
	grace   time.Duration

	// member is true while the node carries ComputeDomainLabel (as of the
	// last successful label read).
	member bool
	// state and reason are what the last tick found; a change is logged.
	state  State
	reason string
	// domainSkipped is true once the skipped domain probe was logged for
	// the current target kind.
	domainSkipped bool
	// open holds the findings raised and not resolved, by key.
	open map[monitors.Key]raised
}

// tick checks membership, finds the daemon and, when there is one to
// judge, runs the probes. It returns an error only to end Run.
func (r *run) tick(ctx context.Context) error {
	labels, err := r.src.NodeLabels(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Error(err, "Reading node labels failed; skipping IMEX checks this time")
		}
		return nil
	}
	uid, member := labels[ComputeDomainLabel]
	switch {
	case member && !r.member:
		r.log.Info("Node is in a ComputeDomain; starting IMEX checks", "computeDomain", uid)
	case !member && r.member:
		r.log.Info("Node left its ComputeDomain; stopping IMEX checks", "resolved", len(r.open))
		r.resolveAll("node left its ComputeDomain")
	}
	r.member = member
	if !member {
		r.setState(StateNotMember, "the node carries no "+ComputeDomainLabel+" label")
		return nil
	}

	t, state, reason := r.findDaemon(ctx, uid)
	if ctx.Err() != nil {
		return nil //nolint:nilerr // the context is done: the run stops, which is no failure
	}
	r.setState(state, reason)
	switch state {
	case StateChecking:
	case StateNoClique:
		// Not judged for good (until the pod changes): what was raised
		// about this node's IMEX no longer applies.
		r.resolveAll("IMEX is not judged: " + reason)
		return nil
	default:
		return nil
	}
	if err := r.checkDaemon(ctx, t); err != nil {
		return err
	}
	return r.checkDomain(ctx, t)
}

// setState records what the tick found, and logs and exports a change.
func (r *run) setState(st State, reason string) {
	if st == r.state && reason == r.reason {
		return
	}
	if st == StateChecking {
		r.log.Info("Checking IMEX", "state", st, "target", reason)
	} else {
		r.log.Info("IMEX is not judged on this node now", "state", st, "reason", reason)
	}
	r.state, r.reason = st, reason
	setState(st)
}

// findDaemon returns the daemon to probe and StateChecking, or the state
// that says why there is none, with a reason for the logs.
func (r *run) findDaemon(ctx context.Context, uid string) (Target, State, string) {
	var podsErr error
	if r.src.Pods != nil {
		pods, err := r.src.Pods.DaemonPods(ctx)
		podsErr = err
		if err == nil {
			if p := daemonPod(pods, r.src.NodeName, uid); p != nil {
				return r.podTarget(p)
			}
		}
	}
	if t, ok := r.hostTarget(); ok {
		return t, StateChecking, "host-managed daemon at " + t.String()
	}
	switch {
	case podsErr != nil:
		return Target{}, StatePodsUnreadable, fmt.Sprintf("reading the ComputeDomain daemon pods failed: %v", podsErr)
	case r.src.Pods == nil:
		return Target{}, StateNoDaemonPod, "daemon pods are not looked up and no host-managed daemon is configured (imex.address, imex.configFile)"
	default:
		return Target{}, StateNoDaemonPod, fmt.Sprintf("no ComputeDomain daemon pod of domain %s is bound to this node", uid)
	}
}

// podTarget judges a daemon pod: the target is its IP on the command port.
func (r *run) podTarget(p *corev1.Pod) (Target, State, string) {
	name := p.Namespace + "/" + p.Name
	if clique, ok := p.Labels[CliqueLabel]; ok && clique == "" {
		return Target{}, StateNoClique, fmt.Sprintf("daemon pod %s has an empty %s label: the node has no NVLink clique and the driver runs no IMEX daemon there", name, CliqueLabel)
	}
	if p.Status.PodIP == "" {
		return Target{}, StateDaemonStarting, fmt.Sprintf("daemon pod %s has no IP address yet", name)
	}
	// The driver's readiness probe for the daemon pod is
	// "nvidia-imex-ctl -q prints READY".
	if !readiness.Pod(p) && r.grace > 0 && p.Status.StartTime != nil {
		if age := r.clock.Since(p.Status.StartTime.Time); age < r.grace {
			return Target{}, StateDaemonStarting, fmt.Sprintf("daemon pod %s started %s ago and is not Ready yet; judged after %s", name, age.Round(time.Second), r.grace)
		}
	}
	t := Target{Address: p.Status.PodIP, Port: r.src.Port}
	return t, StateChecking, fmt.Sprintf("daemon pod %s at %s", name, t)
}

// hostTarget is the configured host-managed daemon, if any.
func (r *run) hostTarget() (Target, bool) {
	switch {
	case r.src.Address != "":
		return Target{Address: r.src.Address, Port: r.src.Port}, true
	case r.src.ConfigFile != "":
		return Target{ConfigFile: r.src.ConfigFile}, true
	}
	return Target{}, false
}

// notConfigured ends Run for a node where IMEX is not configured: what was
// raised resolves, and the agent tries the source again later.
func (r *run) notConfigured(args []string, err error) error {
	runs.WithLabelValues(resultOK).Inc()
	r.resolveAll("IMEX is not configured on this node")
	r.setState(StateNotConfigured, err.Error())
	return monitors.Unavailable("IMEX is not configured on this node: nvidia-imex-ctl %s: %v", strings.Join(args, " "), err)
}

// checkDaemon runs the daemon probe and raises or resolves its finding. It
// returns an error only when IMEX is not configured (see notConfigured).
func (r *run) checkDaemon(ctx context.Context, t Target) error {
	args, err := DaemonStatusArgs(t)
	if err != nil {
		return err
	}
	out, err := r.exec(ctx, args)
	if ctx.Err() != nil {
		return nil //nolint:nilerr // the context is done: the run stops, which is no failure
	}
	var code, msg string
	switch {
	case errors.Is(err, ErrNotConfigured):
		return r.notConfigured(args, err)
	case errors.Is(err, ErrMalformed):
		runs.WithLabelValues(resultMalformed).Inc()
		r.log.Error(err, "Skipping IMEX daemon status that cannot be read")
		return nil
	case errors.Is(err, errTimeout):
		runs.WithLabelValues(resultError).Inc()
		code, msg = CodeTimeout, fmt.Sprintf("nvidia-imex-ctl %s did not answer within %s", strings.Join(args, " "), r.timeout)
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
		// exec has already said ErrNotConfigured for that output.
		state, perr := ParseDaemonStatus(out)
		if perr != nil {
			runs.WithLabelValues(resultMalformed).Inc()
			r.log.Error(perr, "Skipping IMEX daemon status that cannot be read")
			return nil
		}
		runs.WithLabelValues(resultOK).Inc()
		if state == DaemonReady {
			r.observe(gpuhealthv1alpha1.CheckIMEXDaemon, nil, "IMEX daemon is READY")
			return nil
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
	return nil
}

// domainNotAsked explains why a daemon reached over its command port is not
// asked for the domain's status.
const domainNotAsked = "nvidia-imex-ctl -N reads the domain's nodes from the daemon's config file, which is inside the ComputeDomain daemon pod, and cannot be combined with -i; the operator judges the domain from the ComputeDomain's status"

// checkDomain runs the domain probe, when the target allows one, and raises
// or resolves its finding. It returns an error only when IMEX is not
// configured (see notConfigured).
func (r *run) checkDomain(ctx context.Context, t Target) error {
	args, ok := DomainStatusArgs(t)
	if !ok {
		if !r.domainSkipped {
			r.log.Info("Not checking the IMEX domain", "reason", domainNotAsked)
			r.domainSkipped = true
		}
		// A domain finding raised through a config file is not checked
		// any more; leaving it open would keep it open until the node
		// leaves its domain.
		r.observe(gpuhealthv1alpha1.CheckIMEXDomain, nil, "IMEX domain no longer checked: "+domainNotAsked)
		return nil
	}
	r.domainSkipped = false
	out, err := r.exec(ctx, args)
	if ctx.Err() != nil {
		return nil //nolint:nilerr // the context is done: the run stops, which is no failure
	}
	if errors.Is(err, ErrNotConfigured) {
		return r.notConfigured(args, err)
	}
	if err != nil && !errors.Is(err, ErrMalformed) {
		// The daemon probe reports a daemon that does not answer; the
		// domain's state is unknown, which is not a change.
		runs.WithLabelValues(resultError).Inc()
		r.log.V(1).Info("IMEX domain probe failed", "err", err)
		return nil
	}
	d, perr := ParseDomainStatus(out) // exec has already said ErrNotConfigured
	if err = errors.Join(err, perr); err != nil {
		runs.WithLabelValues(resultMalformed).Inc()
		r.log.Error(err, "Skipping IMEX domain status that cannot be read")
		return nil
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
	return nil
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
		notReady = append(notReady, excerpt(name)+" "+excerpt(status))
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
	// It exits 255 with this message where IMEX is not configured; the
	// message decides, on either stream, whatever the exit status.
	for _, b := range [][]byte{stdout.Bytes(), stderr.Bytes()} {
		if isNotConfigured(b) {
			return stdout.Bytes(), fmt.Errorf("%w: %q (%v)", ErrNotConfigured, excerpt(firstLine(b)), exitOf(err))
		}
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

// firstLine returns the first non-empty line of b, trimmed.
func firstLine(b []byte) string {
	for _, l := range bytes.Split(b, []byte("\n")) {
		if l = bytes.TrimSpace(l); len(l) > 0 {
			return string(l)
		}
	}
	return ""
}

// exitOf describes how a run ended, for messages.
func exitOf(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// durationOr returns d, or def when d is not positive.
func durationOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
