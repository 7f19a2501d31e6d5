package dcgm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/slowgpu"
)

// Defaults for Source's fields.
const (
	// DefaultPort is nv-hostengine's default TCP port.
	DefaultPort = "5555"
	// DefaultAddress is where a standalone source looks for nv-hostengine
	// when Address is empty: a host engine on the node itself, as the GPU
	// Operator's DCGM DaemonSet runs it with host networking.
	DefaultAddress = "localhost:" + DefaultPort
	// DefaultPollInterval is how often the fields and health watches are
	// read. DCGM refreshes watched fields at the same interval; 10 s keeps
	// the host engine's load negligible while a link or IMEX condition is
	// seen within seconds of DCGM seeing it. XIDs do not wait for it: they
	// arrive through policy callbacks.
	DefaultPollInterval = 10 * time.Second
	// DefaultWindow is the window NVLink error rates are averaged over.
	// Sixty seconds (six polls) smooths the bursts a single retraining
	// produces, and keeps detection and resolution within about a minute.
	DefaultWindow = time.Minute
	// DefaultRepeatInterval is how often a condition that still holds is
	// reported again, so that its event's lastSeen moves.
	DefaultRepeatInterval = 5 * time.Minute
	// DefaultMaxPollFailures is how many polls in a row may fail entirely
	// (every DCGM call of the poll failed) before Run gives up: one minute
	// at the default interval. A standalone host engine that went away never
	// comes back on the same connection, and go-dcgm does not close the
	// policy channel then, so only the polls can tell that the source died.
	DefaultMaxPollFailures = 6
)

// DefaultNVLinkThresholds are the NVLink error rates, in errors per second
// averaged over Window, above which a GPU's total counter is a finding.
//
//   - CRC flit and CRC data errors: 100/s, the limit DCGM's own NVLink health
//     watch uses for DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD ("more than 100 CRC
//     errors are happening per second", dcgm_errors.h). Links see a trickle
//     of CRC errors that replays absorb; only a sustained rate means a
//     marginal link.
//   - Replay and recovery errors: 0, so any increase within the window is a
//     finding. A healthy link has none: a replay is a retransmission that
//     already failed its CRC, and a recovery is a link retraining that
//     stalls traffic. This is the strictest setting; a fleet that sees
//     harmless replays can raise it.
func DefaultNVLinkThresholds() map[Field]float64 {
	return map[Field]float64{
		FieldNVLinkCRCFlitErrorTotal:  100,
		FieldNVLinkCRCDataErrorTotal:  100,
		FieldNVLinkReplayErrorTotal:   0,
		FieldNVLinkRecoveryErrorTotal: 0,
	}
}

// Source is the DCGM source (name "dcgm"). It listens for DCGM's XID and
// NVLink policy violations, and every PollInterval reads the GPUs' NVLink
// error totals and recovery actions, the IMEX status fields and the health
// watches in DefaultHealthSystems (memory, PCIe, InfoROM, thermal, power,
// NVLink, NVSwitch, IMEX). See mapping.go for what each signal becomes.
//
// The zero value works: embedded DCGM with the defaults below. Run does not
// change the fields.
type Source struct {
	// Mode is embedded (the default when empty: DCGM runs inside the agent)
	// or standalone (connect to nv-hostengine at Address).
	Mode Mode
	// Address is nv-hostengine's "host:port" for standalone mode; a host
	// without a port gets DefaultPort, an empty one is DefaultAddress. An
	// address that starts with "/" is a Unix socket path. Ignored in
	// embedded mode.
	Address string
	// PollInterval is how often fields and health watches are read, and how
	// often DCGM refreshes the fields. Zero means DefaultPollInterval.
	PollInterval time.Duration
	// Window is the window NVLink error rates are averaged over. Zero means
	// DefaultWindow. A rate is judged only once readings span a whole
	// window, so a condition starts and ends at least Window after the
	// counter starts or stops rising fast.
	Window time.Duration
	// NVLinkThresholds are the per-GPU NVLink total counters judged as
	// rates and their limits in errors per second: a rate above the limit
	// is a finding (0 means any increase). Nil means
	// DefaultNVLinkThresholds(); a counter left out of a non-nil map is not
	// judged. Only the counters in DefaultNVLinkThresholds are watched.
	NVLinkThresholds map[Field]float64
	// RepeatInterval is how often a condition that still holds is reported
	// again. Zero means DefaultRepeatInterval.
	RepeatInterval time.Duration
	// MaxPollFailures is how many polls in a row may fail entirely before
	// Run returns an error (the source died). Zero means
	// DefaultMaxPollFailures; negative means never.
	MaxPollFailures int
	// NewClient connects to DCGM. Nil means Connect (go-dcgm).
	NewClient NewClientFunc
	// Performance configures the slow-GPU checks the DCGM fields feed.
	Performance slowgpu.Config
	// Clock is the clock polls and rates use. Nil means the real clock.
	Clock clock.WithTicker
	// Log receives the source's logs; the zero Logger discards them.
	Log logr.Logger
}

var _ monitors.Source = (*Source)(nil)

// Name implements monitors.Source.
func (s *Source) Name() string { return string(gpuhealthv1alpha1.SourceDCGM) }

// settings are Source's fields with the defaults applied.
type settings struct {
	client          ClientConfig
	poll            time.Duration
	window          time.Duration
	thresholds      map[Field]float64
	repeat          time.Duration
	maxPollFailures int
	newClient       NewClientFunc
	clock           clock.WithTicker
	performance     slowgpu.Config
}

// settings applies the defaults and checks the fields.
func (s *Source) settings() (settings, error) {
	st := settings{
		poll:            s.PollInterval,
		window:          s.Window,
		thresholds:      s.NVLinkThresholds,
		repeat:          s.RepeatInterval,
		maxPollFailures: s.MaxPollFailures,
		newClient:       s.NewClient,
		clock:           s.Clock,
		performance:     s.Performance,
	}
	if st.poll <= 0 {
		st.poll = DefaultPollInterval
	}
	if st.window <= 0 {
		st.window = DefaultWindow
	}
	if st.thresholds == nil {
		st.thresholds = DefaultNVLinkThresholds()
	}
	for f, limit := range st.thresholds {
		if _, ok := DefaultNVLinkThresholds()[f]; !ok {
			return st, fmt.Errorf("NVLink threshold for %s: only the NVLink total counters can be judged", f)
		}
		if limit < 0 {
			return st, fmt.Errorf("NVLink threshold for %s is %g errors/s; it must not be negative", f, limit)
		}
	}
	if st.repeat <= 0 {
		st.repeat = DefaultRepeatInterval
	}
	if st.maxPollFailures == 0 {
		st.maxPollFailures = DefaultMaxPollFailures
	}
	if st.newClient == nil {
		st.newClient = Connect
	}
	if st.clock == nil {
		st.clock = clock.RealClock{}
	}
	st.client = ClientConfig{
		Mode:           s.Mode,
		UpdateInterval: st.poll,
		GPUFields:      gpuFields,
		GlobalFields:   imexFields,
		HealthSystems:  DefaultHealthSystems,
	}
	switch s.Mode {
	case "", ModeEmbedded:
		st.client.Mode = ModeEmbedded
	case ModeStandalone:
		st.client.Address, st.client.UnixSocket = hostEngineAddress(s.Address)
	default:
		return st, fmt.Errorf("unknown DCGM mode %q: use %q or %q", s.Mode, ModeEmbedded, ModeStandalone)
	}
	return st, nil
}

// hostEngineAddress normalizes a standalone address: a Unix socket path, or
// host:port with DefaultPort when the port is missing.
func hostEngineAddress(addr string) (string, bool) {
	switch {
	case addr == "":
		return DefaultAddress, false
	case strings.HasPrefix(addr, "/"):
		return addr, true
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr, false
	}
	return net.JoinHostPort(strings.Trim(addr, "[]"), DefaultPort), false
}

// Run implements monitors.Source. It connects, reports findings until ctx is
// done and returns nil then. Without DCGM (no libdcgm.so.4) it returns an
// error wrapping monitors.ErrUnavailable. It returns any other error when
// the source died: the connection failed, the policy violation channel
// closed, or MaxPollFailures polls in a row failed.
func (s *Source) Run(ctx context.Context, report monitors.Reporter) error {
	st, err := s.settings()
	if err != nil {
		return fmt.Errorf("configuring the DCGM source: %w", err)
	}
	log := s.Log
	log.V(1).Info("Connecting to DCGM", "mode", st.client.Mode, "address", st.client.Address)
	client, err := st.newClient(ctx, st.client)
	if err != nil {
		return fmt.Errorf("connecting to DCGM: %w", err)
	}
	// Cancel the policy subscription before closing the client it lives on.
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		if err := client.Close(); err != nil {
			log.Error(err, "Closing the DCGM connection failed")
		}
	}()

	r, err := newRun(st, client, report, log)
	if err != nil {
		return err
	}
	violations, err := client.PolicyViolations(ctx)
	if err != nil {
		return fmt.Errorf("subscribing to DCGM policy violations: %w", err)
	}
	log.Info("Watching DCGM", "mode", st.client.Mode, "gpus", len(r.gpus), "pollInterval", st.poll)
	return r.loop(ctx, violations)
}

// newRun lists the GPUs and returns the state of one Run.
func newRun(st settings, client Client, report monitors.Reporter, log logr.Logger) (*run, error) {
	gpus, err := client.GPUs()
	if err != nil {
		return nil, fmt.Errorf("listing DCGM GPUs: %w", err)
	}
	return &run{
		settings:   st,
		client:     client,
		gpus:       gpus,
		ids:        newGPUIDs(gpus),
		report:     report,
		log:        log,
		conditions: newConditions(st.repeat),
		windows:    map[windowKey]*counterWindow{},
		recovery:   map[uint]recoveryAction{},
		dropped:    client.DroppedViolations(),
		judges:     map[uint]*slowgpu.Judge{},
		perf:       &monitors.Tracker{Repeat: st.performance.Repeat(st.repeat)},
	}, nil
}

// loop polls at once and then every poll interval, and reports violations
// as they arrive, until ctx is done or the source dies.
func (r *run) loop(ctx context.Context, violations <-chan Violation) error {
	ticker := r.clock.NewTicker(r.poll)
	defer ticker.Stop()
	if err := r.pollOnce(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case v, ok := <-violations:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("the DCGM policy violation channel closed")
			}
			r.violation(v)
		case <-ticker.C():
			if err := r.pollOnce(); err != nil {
				return err
			}
		}
	}
}

// windowKey identifies one GPU's counter.
type windowKey struct {
	gpu   uint
	field Field
}

// run is the state of one Run.
type run struct {
	settings
	client     Client
	gpus       []GPU
	ids        gpuIDs
	report     monitors.Reporter
	log        logr.Logger
	conditions *conditions
	windows    map[windowKey]*counterWindow
	// recovery is each GPU's GPU recovery action at the last poll that read
	// it.
	recovery map[uint]recoveryAction
	// dropped is the client's drop count at the last poll.
	dropped uint64
	// failedPolls counts polls in a row in which every call failed.
	failedPolls int
	// judges are the slow-GPU judges by GPU id, and perf the conditions
	// they hold.
	judges map[uint]*slowgpu.Judge
	perf   *monitors.Tracker
}

// violation reports one policy violation as an event.
func (r *run) violation(v Violation) {
	kind := v.Kind
	if kind != ViolationXID && kind != ViolationNVLink {
		kind = ViolationOther // keep the label bounded
	}
	policyViolations.WithLabelValues(string(kind)).Inc()
	f, ok := violationToFinding(v, r.ids)
	if !ok {
		r.log.V(1).Info("Ignoring a DCGM policy violation of a kind the source does not report", "kind", v.Kind, "gpu", v.GPU)
		return
	}
	if v.Kind == ViolationXID && v.XID == xidRecoveryAction {
		r.xidRecoveryAction(v.GPU, &f)
	}
	r.log.V(4).Info("DCGM policy violation", "finding", f.String())
	if f.Time.IsZero() {
		f.Time = r.clock.Now()
	}
	r.report(f)
}

// xidRecoveryAction is the XID the driver logs when a GPU's recovery action
// changes.
const xidRecoveryAction = 154

// xidRecoveryAction judges an XID 154 violation by the GPU's recovery action,
// read now: DCGM's violation carries no driver message, from which the XID
// catalog would read the action. When the field does not ask for a reset or
// a reboot (or cannot be read, or DCGM has not refreshed it yet), the
// finding is left to the catalog.
func (r *run) xidRecoveryAction(gpu uint, f *monitors.Finding) {
	values, err := r.client.GPUValues(gpu, []Field{FieldGPURecoveryAction})
	if err != nil || len(values) == 0 || !values[0].Valid {
		return
	}
	a := recoveryAction(values[0].Int)
	r.recovery[gpu] = a
	applyRecovery(f, a)
}

// pollOnce reads the counters, IMEX fields, health watches and drop count
// once. It returns an error only when MaxPollFailures polls in a row failed.
func (r *run) pollOnce() error {
	calls, failed := 0, 0
	count := func(err error, what string, keysAndValues ...any) {
		calls++
		if err != nil {
			failed++
			pollErrors.Inc()
			r.log.Error(err, "Reading DCGM failed", append([]any{"read", what}, keysAndValues...)...)
		}
	}
	now := r.clock.Now()
	for _, g := range r.gpus {
		count(r.pollGPU(g.ID, now), "gpu", "gpu", g.ID)
	}
	count(r.pollIMEX(now), "imex")
	count(r.pollHealth(now), "health")
	r.pollDropped()

	if failed < calls {
		r.failedPolls = 0
		return nil
	}
	r.failedPolls++
	if r.maxPollFailures > 0 && r.failedPolls >= r.maxPollFailures {
		return fmt.Errorf("every DCGM read failed in %d polls in a row", r.failedPolls)
	}
	return nil
}

// pollGPU reads one GPU's fields: it records the recovery action and judges
// the NVLink error totals as rates.
func (r *run) pollGPU(gpu uint, now time.Time) error {
	values, err := r.client.GPUValues(gpu, gpuFields)
	if err != nil {
		return err
	}
	r.judgeSlowGPU(gpu, now, values)
	for _, v := range values {
		if v.Field == FieldGPURecoveryAction {
			if v.Valid {
				r.recovery[gpu] = recoveryAction(v.Int)
			} else {
				delete(r.recovery, gpu)
			}
			continue
		}
		limit, judged := r.thresholds[v.Field]
		if !judged || !v.Valid {
			continue
		}
		t := v.Time
		if t.IsZero() {
			t = now
		}
		k := windowKey{gpu: gpu, field: v.Field}
		w, ok := r.windows[k]
		if !ok {
			w = &counterWindow{}
			r.windows[k] = w
		}
		res := w.add(t, v.Int, r.window)
		if res.reset {
			r.log.V(1).Info("NVLink error counter went down; restarting its window", "gpu", gpu, "field", v.Field.String(), "value", v.Int)
		}
		if !res.judged {
			continue
		}
		f := monitors.Finding{
			Source:    gpuhealthv1alpha1.SourceDCGM,
			Check:     gpuhealthv1alpha1.CheckNVLinkErrors,
			Component: r.ids.gpuComponent(gpu),
			Code:      v.Field.String(),
			Severity:  gpuhealthv1alpha1.SeverityDegraded,
			Action:    gpuhealthv1alpha1.ActionRecertify,
			Message: fmt.Sprintf("%s rose by %d in %s (%.1f/s) on GPU %d, threshold %g/s",
				v.Field, res.delta, res.span.Round(time.Second), res.rate, gpu, limit),
		}
		if res.rate > limit {
			r.conditions.hold(scopeRate, f, now, r.report)
			continue
		}
		r.conditions.release(f.Key(), fmt.Sprintf("%s rate back to %.1f/s over %s on GPU %d, threshold %g/s",
			v.Field, res.rate, res.span.Round(time.Second), gpu, limit), now, r.report)
	}
	return nil
}

// judgeSlowGPU hands the GPU's slow-GPU fields to its judge. A field DCGM
// has no value for (not supported on this GPU, not watched yet) leaves its
// signal unread.
func (r *run) judgeSlowGPU(gpu uint, now time.Time, values []FieldValue) {
	f := map[Field]int64{}
	for _, v := range values {
		if v.Valid {
			f[v.Field] = v.Int
		}
	}
	has := func(fields ...Field) bool {
		for _, x := range fields {
			if _, ok := f[x]; !ok {
				return false
			}
		}
		return true
	}
	u32 := func(x Field) uint32 { return uint32(max(0, min(f[x], math.MaxUint32))) }
	u64 := func(x Field) *uint64 { v := uint64(max(0, f[x])); return &v }
	var rd slowgpu.Reading
	if has(FieldClocksEventReasons) {
		rd.Clocks = &slowgpu.Clocks{Reasons: uint64(f[FieldClocksEventReasons]), SM: u32(FieldSMClock), SMMax: u32(FieldMaxSMClock)}
	}
	for field, p := range map[Field]slowgpu.Policy{FieldPowerViolation: slowgpu.PolicyPower, FieldThermalViolation: slowgpu.PolicyThermal, FieldReliabilityViolation: slowgpu.PolicyReliability} {
		if has(field) {
			if rd.Violations == nil {
				rd.Violations = map[slowgpu.Policy]time.Duration{}
			}
			rd.Violations[p] = time.Duration(max(0, f[field]))
		}
	}
	if has(FieldPCIeLinkGen, FieldPCIeLinkWidth, FieldPCIeMaxLinkGen, FieldPCIeMaxLinkWidth, FieldGPUUtil) {
		rd.PCIe = &slowgpu.PCIe{
			Generation: int(u32(FieldPCIeLinkGen)), Width: int(u32(FieldPCIeLinkWidth)),
			MaxGeneration: int(u32(FieldPCIeMaxLinkGen)), MaxWidth: int(u32(FieldPCIeMaxLinkWidth)),
			Utilization: u32(FieldGPUUtil),
		}
	}
	if has(FieldPCIeReplayCounter) {
		rd.Replays = u64(FieldPCIeReplayCounter)
	}
	if has(FieldRowRemapPending, FieldRowRemapFailed) {
		rd.Remap = &slowgpu.Remap{
			Correctable: int(u32(FieldRowRemapCorrectable)), Uncorrectable: int(u32(FieldRowRemapUncorrectable)),
			Pending: f[FieldRowRemapPending] != 0, Failed: f[FieldRowRemapFailed] != 0,
		}
	}
	if has(FieldRetiredPending) {
		p := f[FieldRetiredPending] != 0
		rd.RetiredPending = &p
	}
	if has(FieldECCDBEVolatileTotal) {
		rd.VolatileUncorrected = u64(FieldECCDBEVolatileTotal)
	}
	if has(FieldGPUTemp, FieldSlowdownTemp) {
		rd.Temperature = &slowgpu.Temperature{GPU: u32(FieldGPUTemp), Slowdown: u32(FieldSlowdownTemp)}
	}
	j := r.judges[gpu]
	if j == nil {
		j = &slowgpu.Judge{Source: gpuhealthv1alpha1.SourceDCGM, Index: int(gpu), UUID: r.ids.component(gpu), Config: r.performance}
		r.judges[gpu] = j
	}
	j.Observe(now, rd, r.perf, r.report)
}

// pollIMEX judges the IMEX domain and daemon status fields. A field without
// a value (a DCGM too old to know the fields) changes nothing. A status that
// says IMEX does not apply here (not installed, not configured, or DCGM
// could not run nvidia-imex-ctl) is never a finding and resolves one.
func (r *run) pollIMEX(now time.Time) error {
	values, err := r.client.GlobalValues(imexFields)
	if err != nil {
		return err
	}
	imex := func(check gpuhealthv1alpha1.Check, id, code string, severity gpuhealthv1alpha1.Severity, message string) monitors.Finding {
		return monitors.Finding{
			Source:    gpuhealthv1alpha1.SourceDCGM,
			Check:     check,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: id},
			Code:      code,
			Severity:  severity,
			Action:    gpuhealthv1alpha1.ActionRecertify,
			Message:   message,
		}
	}
	for _, v := range values {
		if !v.Valid {
			continue
		}
		switch v.Field {
		case FieldIMEXDomainStatus:
			down := imex(gpuhealthv1alpha1.CheckIMEXDomain, imexDomainID, imexDomainDown, gpuhealthv1alpha1.SeverityFatal,
				"IMEX domain status is DOWN")
			degraded := imex(gpuhealthv1alpha1.CheckIMEXDomain, imexDomainID, imexDomainDegraded, gpuhealthv1alpha1.SeverityDegraded,
				"IMEX domain status is DEGRADED")
			cleared := fmt.Sprintf("IMEX domain status is %s", v.String)
			switch v.String {
			case imexDomainUp:
				r.conditions.release(down.Key(), cleared, now, r.report)
				r.conditions.release(degraded.Key(), cleared, now, r.report)
			case imexDomainDown:
				r.conditions.release(degraded.Key(), cleared, now, r.report)
				r.conditions.hold(scopeIMEX, down, now, r.report)
			case imexDomainDegraded:
				r.conditions.release(down.Key(), cleared, now, r.report)
				r.conditions.hold(scopeIMEX, degraded, now, r.report)
			case imexDomainNotInstalled, imexDomainNotConfigured, imexDomainUnavailable:
				cleared += ": IMEX does not apply"
				r.conditions.release(down.Key(), cleared, now, r.report)
				r.conditions.release(degraded.Key(), cleared, now, r.report)
			default:
				r.log.V(1).Info("Ignoring an unknown IMEX domain status", "status", v.String)
			}
		case FieldIMEXDaemonStatus:
			state, ok := imexDaemonStates[v.Int]
			if !ok {
				state = "UNKNOWN"
			}
			f := imex(gpuhealthv1alpha1.CheckIMEXDaemon, imexDaemonID, codeIMEXDaemonNotReady, gpuhealthv1alpha1.SeverityDegraded,
				fmt.Sprintf("IMEX daemon status is %s (%d), not READY (%d)", state, v.Int, imexDaemonReady))
			if v.Int == imexDaemonReady {
				r.conditions.release(f.Key(), "IMEX daemon status is READY", now, r.report)
				continue
			}
			if v.Int < 0 {
				r.conditions.release(f.Key(), fmt.Sprintf("IMEX daemon status is %s (%d): IMEX does not apply", state, v.Int), now, r.report)
				continue
			}
			r.conditions.hold(scopeIMEX, f, now, r.report)
		}
	}
	return nil
}

// pollHealth maps the health check's incidents. An incident the previous
// check reported and this one does not is resolved; a failed check
// resolves nothing. Incidents on one key coalesce: the most severe one
// stands, and it repeats unless every one of them comes from DCGM's XID
// history (see fromXIDHistory).
func (r *run) pollHealth(now time.Time) error {
	incidents, err := r.client.HealthCheck()
	if err != nil {
		return err
	}
	type held struct {
		finding monitors.Finding
		once    bool
	}
	var order []monitors.Key
	seen := map[monitors.Key]*held{}
	for _, in := range incidents {
		f, ok := incidentToFinding(in, r.ids)
		if !ok {
			if in.Code != HealthXIDError {
				r.log.V(1).Info("Ignoring a DCGM health incident the source does not report", "code", uint(in.Code), "message", in.Message)
			}
			continue
		}
		if gpu, ok := incidentGPU(in); ok {
			if a, ok := r.recovery[gpu]; ok {
				applyRecovery(&f, a)
			}
		}
		once := fromXIDHistory(in)
		h, ok := seen[f.Key()]
		if !ok {
			seen[f.Key()] = &held{finding: f, once: once}
			order = append(order, f.Key())
			continue
		}
		h.once = h.once && once
		if severityRank[f.Severity] > severityRank[h.finding.Severity] {
			h.finding = f
		}
	}
	keys := make(map[monitors.Key]bool, len(seen))
	for _, k := range order {
		h := seen[k]
		keys[k] = true
		if h.once {
			r.conditions.holdOnce(scopeHealth, h.finding, now, r.report)
			continue
		}
		r.conditions.hold(scopeHealth, h.finding, now, r.report)
	}
	r.conditions.sweep(scopeHealth, keys, "DCGM health check no longer reports it", now, r.report)
	return nil
}

// severityRank orders severities, so that the worst of coalescing incidents
// stands.
var severityRank = map[gpuhealthv1alpha1.Severity]int{
	gpuhealthv1alpha1.SeverityInfo:     1,
	gpuhealthv1alpha1.SeverityDegraded: 2,
	gpuhealthv1alpha1.SeverityFatal:    3,
}

// pollDropped logs and counts policy violations go-dcgm dropped since the
// last poll.
func (r *run) pollDropped() {
	n := r.client.DroppedViolations()
	if n <= r.dropped {
		return
	}
	d := n - r.dropped
	r.dropped = n
	droppedViolations.Add(float64(d))
	r.log.Info("DCGM dropped policy violations", "dropped", d, "droppedTotal", n)
}
