package dcgm

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

const poll = DefaultPollInterval

// resolved returns f marked resolved.
func resolved(f monitors.Finding) monitors.Finding {
	f.Resolved = true
	return f
}

// crcFlit is the rate finding of GPU-aaaa's CRC flit counter.
var crcFlit = monitors.Finding{
	Source:    gpuhealthv1alpha1.SourceDCGM,
	Check:     gpuhealthv1alpha1.CheckNVLinkErrors,
	Component: gpuComponent("GPU-aaaa"),
	Code:      "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
	Severity:  gpuhealthv1alpha1.SeverityDegraded,
	Action:    gpuhealthv1alpha1.ActionRecertify,
}

// recovery is the rate finding of GPU-aaaa's recovery counter.
var recovery = func() monitors.Finding {
	f := crcFlit
	f.Code = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL"
	return f
}()

// ramp returns n counter values starting at 0, rising by step.
func ramp(step int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i) * step
	}
	return out
}

func TestNVLinkRate(t *testing.T) {
	type step struct {
		// value is GPU 0's counter before the poll; polls are 10 s apart.
		value int64
		want  []monitors.Finding
	}
	// steps builds steps from values; want maps a step index to findings.
	steps := func(values []int64, want map[int][]monitors.Finding) []step {
		out := make([]step, len(values))
		for i, v := range values {
			out[i] = step{value: v, want: want[i]}
		}
		return out
	}
	concat := func(parts ...[]int64) []int64 {
		var out []int64
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name   string
		source Source
		field  Field
		steps  []step
	}{
		{
			name:  "a rate over the threshold raises once a window is judged and resolves when the rate falls back",
			field: FieldNVLinkCRCFlitErrorTotal,
			steps: steps(concat(ramp(1010, 9), []int64{8080, 8080}), map[int][]monitors.Finding{
				6: {crcFlit},           // 6060 in 60 s = 101/s > 100/s
				9: {resolved(crcFlit)}, // (8080-3030)/60 s = 84/s
			}),
		},
		{
			name:  "a rate equal to the threshold is not a finding",
			field: FieldNVLinkCRCFlitErrorTotal,
			steps: steps(ramp(1000, 12), nil),
		},
		{
			name:  "a counter reset restarts the window and resolves nothing until a whole window after it is judged",
			field: FieldNVLinkCRCFlitErrorTotal,
			steps: steps(concat(ramp(1010, 7), []int64{0, 0, 0, 0, 0, 0, 0}), map[int][]monitors.Finding{
				6:  {crcFlit},
				13: {resolved(crcFlit)}, // 60 s after the reset at step 7
			}),
		},
		{
			name:  "a counter reset during an error storm keeps the condition without reporting it again",
			field: FieldNVLinkCRCFlitErrorTotal,
			steps: steps(concat(ramp(1010, 7), ramp(2000, 10)), map[int][]monitors.Finding{
				6: {crcFlit},
			}),
		},
		{
			name:   "a condition that persists is reported again every repeat interval",
			source: Source{RepeatInterval: 30 * time.Second},
			field:  FieldNVLinkCRCFlitErrorTotal,
			steps: steps(ramp(2000, 13), map[int][]monitors.Finding{
				6: {crcFlit}, 9: {crcFlit}, 12: {crcFlit},
			}),
		},
		{
			name:  "any increase of the recovery counter is a finding with the default threshold",
			field: FieldNVLinkRecoveryErrorTotal,
			steps: steps([]int64{4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5}, map[int][]monitors.Finding{
				6:  {recovery},
				12: {resolved(recovery)}, // no increase since step 6
			}),
		},
		{
			name:   "a counter left out of the thresholds is not judged",
			source: Source{NVLinkThresholds: map[Field]float64{FieldNVLinkCRCDataErrorTotal: 100}},
			field:  FieldNVLinkCRCFlitErrorTotal,
			steps:  steps(ramp(100000, 10), nil),
		},
		{
			name:   "a lower threshold raises on a lower rate",
			source: Source{NVLinkThresholds: map[Field]float64{FieldNVLinkCRCFlitErrorTotal: 1}},
			field:  FieldNVLinkCRCFlitErrorTotal,
			steps: steps(ramp(11, 7), map[int][]monitors.Finding{
				6: {crcFlit},
			}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			client := newFakeClient()
			p := newPoller(t, tt.source, client)
			for i, s := range tt.steps {
				client.setCounter(0, tt.field, s.value)
				d := poll
				if i == 0 {
					d = 0
				}
				p.poll(d)
				g.Expect(p.rec.take()).To(Equal(s.want), "step %d (t=%s, value %d)", i, time.Duration(i)*poll, s.value)
			}
		})
	}
}

func TestNVLinkRateMessage(t *testing.T) {
	g := NewWithT(t)
	client := newFakeClient()
	p := newPoller(t, Source{}, client)
	for i, v := range ramp(1200, 7) {
		client.setCounter(1, FieldNVLinkCRCDataErrorTotal, v)
		p.poll(time.Duration(min(i, 1)) * poll)
	}
	got := p.rec.all()
	g.Expect(got).To(HaveLen(1))
	g.Expect(got[0].Component.ID).To(Equal("GPU-bbbb"))
	g.Expect(got[0].Message).To(Equal("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL rose by 7200 in 1m0s (120.0/s) on GPU 1, threshold 100/s"))
	g.Expect(got[0].Time).To(Equal(testStart.Add(6 * poll)))
}

func TestIMEX(t *testing.T) {
	imexFinding := func(check gpuhealthv1alpha1.Check, id, code string, sev gpuhealthv1alpha1.Severity) monitors.Finding {
		return monitors.Finding{
			Source:    gpuhealthv1alpha1.SourceDCGM,
			Check:     check,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: id},
			Code:      code,
			Severity:  sev,
			Action:    gpuhealthv1alpha1.ActionRecertify,
		}
	}
	down := imexFinding(gpuhealthv1alpha1.CheckIMEXDomain, "domain", "DOWN", gpuhealthv1alpha1.SeverityFatal)
	degraded := imexFinding(gpuhealthv1alpha1.CheckIMEXDomain, "domain", "DEGRADED", gpuhealthv1alpha1.SeverityDegraded)
	notReady := imexFinding(gpuhealthv1alpha1.CheckIMEXDaemon, "daemon", "NOT_READY", gpuhealthv1alpha1.SeverityDegraded)

	type step struct {
		// domain and daemon are the fields' values; nil is no value.
		domain, daemon any
		want           []monitors.Finding
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "a DOWN domain is a Fatal IMEXDomain finding that resolves when the domain is UP",
			steps: []step{
				{domain: "UP", daemon: 5},
				{domain: "DOWN", daemon: 5, want: []monitors.Finding{down}},
				{domain: "DOWN", daemon: 5},
				{domain: "UP", daemon: 5, want: []monitors.Finding{resolved(down)}},
			},
		},
		{
			name: "a domain going from DOWN to DEGRADED resolves DOWN and raises DEGRADED",
			steps: []step{
				{domain: "DOWN", want: []monitors.Finding{down}},
				{domain: "DEGRADED", want: []monitors.Finding{resolved(down), degraded}},
				{domain: "UP", want: []monitors.Finding{resolved(degraded)}},
			},
		},
		{
			name: "a daemon that is not READY is a Degraded IMEXDaemon finding that resolves on READY",
			steps: []step{
				{daemon: 5},
				{daemon: 7, want: []monitors.Finding{notReady}},
				{daemon: 5, want: []monitors.Finding{resolved(notReady)}},
			},
		},
		{
			name: "a daemon passing through several states that are not READY is one condition",
			steps: []step{
				{daemon: 0, want: []monitors.Finding{notReady}},
				{daemon: 2},
				{daemon: 4},
				{daemon: 5, want: []monitors.Finding{resolved(notReady)}},
			},
		},
		{
			name: "IMEX fields without a value change nothing",
			steps: []step{
				{domain: "DOWN", daemon: 3, want: []monitors.Finding{down, notReady}},
				{},
				{domain: "UP", daemon: 5, want: []monitors.Finding{resolved(down), resolved(notReady)}},
			},
		},
		{
			name: "a daemon status below 0 (-1 not installed, -2 not configured, -3 command error) is never a finding",
			steps: []step{
				{daemon: -1},
				{daemon: -2},
				{daemon: -3},
				{daemon: -1},
			},
		},
		{
			name: "a NOT_READY daemon resolves when IMEX turns out not installed",
			steps: []step{
				{daemon: 2, want: []monitors.Finding{notReady}},
				{daemon: -1, want: []monitors.Finding{resolved(notReady)}},
				{daemon: 2, want: []monitors.Finding{notReady}},
			},
		},
		{
			name: "a NOT_READY daemon resolves when IMEX turns out not configured",
			steps: []step{
				{daemon: 7, want: []monitors.Finding{notReady}},
				{daemon: -2, want: []monitors.Finding{resolved(notReady)}},
			},
		},
		{
			name: "a NOT_READY daemon resolves when DCGM cannot run nvidia-imex-ctl",
			steps: []step{
				{daemon: 0, want: []monitors.Finding{notReady}},
				{daemon: -3, want: []monitors.Finding{resolved(notReady)}},
			},
		},
		{
			name: "a domain status DCGM writes when IMEX does not apply is never a finding and resolves one",
			steps: []step{
				{domain: "NOT_INSTALLED"},
				{domain: "DOWN", want: []monitors.Finding{down}},
				{domain: "NOT_CONFIGURED", want: []monitors.Finding{resolved(down)}},
				{domain: "DEGRADED", want: []monitors.Finding{degraded}},
				{domain: "UNAVAILABLE", want: []monitors.Finding{resolved(degraded)}},
				{domain: "NOT_INSTALLED"},
			},
		},
		{
			name: "an unknown domain status changes nothing",
			steps: []step{
				{domain: "DOWN", want: []monitors.Finding{down}},
				{domain: "SOMETHING_NEW"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			client := newFakeClient()
			p := newPoller(t, Source{}, client)
			for i, s := range tt.steps {
				client.setGlobal(FieldIMEXDomainStatus, s.domain)
				client.setGlobal(FieldIMEXDaemonStatus, s.daemon)
				p.poll(time.Duration(min(i, 1)) * poll)
				g.Expect(p.rec.take()).To(ConsistOf(s.want), "step %d", i)
			}
		})
	}
}

func TestIMEXDaemonMessage(t *testing.T) {
	g := NewWithT(t)
	client := newFakeClient()
	p := newPoller(t, Source{}, client)
	client.setGlobal(FieldIMEXDaemonStatus, 2)
	p.poll(0)
	got := p.rec.all()
	g.Expect(got).To(HaveLen(1))
	g.Expect(got[0].Message).To(Equal("IMEX daemon status is WAITING_FOR_PEERS (2), not READY (5)"))
}

func TestHealthIncidents(t *testing.T) {
	finding := func(check gpuhealthv1alpha1.Check, c gpuhealthv1alpha1.Component, code string, sev gpuhealthv1alpha1.Severity, act gpuhealthv1alpha1.Action) *monitors.Finding {
		return &monitors.Finding{Source: gpuhealthv1alpha1.SourceDCGM, Check: check, Component: c, Code: code, Severity: sev, Action: act}
	}
	tests := []struct {
		name     string
		incident Incident
		// want is the finding while the incident is reported; nil for none.
		want *monitors.Finding
	}{
		{
			name:     "NVLINK_DOWN is a Degraded NVLinkDown finding on the link",
			incident: Incident{Code: HealthNVLinkDown, Message: "GPU 0's NvLink link 3 is currently down", Entity: Entity{Kind: EntityGPU, ID: 0}},
			want: finding(gpuhealthv1alpha1.CheckNVLinkDown, nvlinkComponent("GPU-aaaa/link-3"), "DCGM_FR_NVLINK_DOWN",
				gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify),
		},
		{
			name:     "NVLINK_CRC_ERROR_THRESHOLD is a Degraded NVLinkErrors finding",
			incident: Incident{Code: HealthNVLinkCRCErrorThreshold, Entity: Entity{Kind: EntityGPU, ID: 1}},
			want: finding(gpuhealthv1alpha1.CheckNVLinkErrors, gpuComponent("GPU-bbbb"), "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD",
				gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify),
		},
		{
			name:     "NVLINK_ERROR_CRITICAL is a Fatal NVLinkErrors finding that asks for a GPU reset",
			incident: Incident{Code: HealthNVLinkErrorCritical, Entity: Entity{Kind: EntityGPU, ID: 0}},
			want: finding(gpuhealthv1alpha1.CheckNVLinkErrors, gpuComponent("GPU-aaaa"), "DCGM_FR_NVLINK_ERROR_CRITICAL",
				gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU),
		},
		{
			name:     "XID_ERROR is ignored because the XID policy violation reports it",
			incident: Incident{Code: HealthXIDError, Message: "Detected XID 79", Entity: Entity{Kind: EntityGPU, ID: 0}},
		},
		{
			name:     "SXID_ERROR is a Fatal SXID finding on the NVSwitch",
			incident: Incident{Code: HealthSXIDError, Message: "Detected fatal NvSwitch SXID 12028", Entity: Entity{Kind: EntitySwitch, ID: 4}},
			want: finding(gpuhealthv1alpha1.CheckSXID, gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "nvswitch-4"}, "12028",
				gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode),
		},
		{
			name:     "FABRIC_MANAGER_TRAINING_ERROR is a Fatal Fabric finding",
			incident: Incident{Code: HealthFabricManagerTrainingError, Entity: Entity{Kind: EntityGPU, ID: 0}},
			want: finding(gpuhealthv1alpha1.CheckFabric, gpuComponent("GPU-aaaa"), "DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR",
				gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRecertify),
		},
		{
			name:     "IMEX_UNHEALTHY is a Degraded IMEXDaemon finding",
			incident: Incident{Code: HealthIMEXUnhealthy, Message: "IMEX daemon status is UNAVAILABLE (7)", Entity: Entity{Kind: EntityNone}},
			want: finding(gpuhealthv1alpha1.CheckIMEXDaemon, gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: "daemon"}, "DCGM_FR_IMEX_UNHEALTHY",
				gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify),
		},
		{
			name:     "an unmapped code is ignored",
			incident: Incident{Code: 12, Message: "Detected clocks event due to power violation in GPU 0.", Entity: Entity{Kind: EntityGPU, ID: 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			client := newFakeClient()
			p := newPoller(t, Source{}, client)

			// First check: the incident is reported once.
			client.setIncidents(tt.incident)
			p.poll(0)
			if tt.want == nil {
				g.Expect(p.rec.take()).To(BeEmpty())
			} else {
				g.Expect(p.rec.take()).To(Equal([]monitors.Finding{*tt.want}))
			}
			// Second check, still there: nothing new.
			p.poll(poll)
			g.Expect(p.rec.take()).To(BeEmpty())
			// Third check, gone: resolved.
			client.setIncidents()
			p.poll(poll)
			if tt.want == nil {
				g.Expect(p.rec.take()).To(BeEmpty())
			} else {
				g.Expect(p.rec.take()).To(Equal([]monitors.Finding{resolved(*tt.want)}))
			}
		})
	}
}

func TestHealthIncidentsResolveOneByOne(t *testing.T) {
	g := NewWithT(t)
	client := newFakeClient()
	p := newPoller(t, Source{}, client)
	linkDown := Incident{Code: HealthNVLinkDown, Message: "GPU 0's NvLink link 3 is currently down", Entity: Entity{Kind: EntityGPU, ID: 0}}
	otherLinkDown := Incident{Code: HealthNVLinkDown, Message: "GPU 0's NvLink link 4 is currently down", Entity: Entity{Kind: EntityGPU, ID: 0}}
	client.setIncidents(linkDown, otherLinkDown)
	p.poll(0)
	g.Expect(p.rec.take()).To(HaveLen(2))

	client.setIncidents(otherLinkDown)
	p.poll(poll)
	got := p.rec.take()
	g.Expect(got).To(HaveLen(1))
	g.Expect(got[0].Resolved).To(BeTrue())
	g.Expect(got[0].Component.ID).To(Equal("GPU-aaaa/link-3"))
}

func TestPollFailures(t *testing.T) {
	broken := errors.New("connection to nv-hostengine lost")
	tests := []struct {
		name string
		// breakAll makes every read fail; otherwise only the health check fails.
		breakAll        bool
		maxPollFailures int
		polls           int
		wantErr         bool
	}{
		{
			name:     "polls in which every read fails end the run after MaxPollFailures in a row",
			breakAll: true, polls: DefaultMaxPollFailures, wantErr: true,
		},
		{
			name:     "fewer failed polls than MaxPollFailures keep the run going",
			breakAll: true, polls: DefaultMaxPollFailures - 1,
		},
		{
			name:     "a poll in which only some reads fail is not a failed poll",
			breakAll: false, polls: 2 * DefaultMaxPollFailures,
		},
		{
			name:     "a negative MaxPollFailures never gives up",
			breakAll: true, maxPollFailures: -1, polls: 2 * DefaultMaxPollFailures,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			client := newFakeClient()
			client.healthErr = broken
			if tt.breakAll {
				client.valuesErr, client.globalErr = broken, broken
			}
			p := newPoller(t, Source{MaxPollFailures: tt.maxPollFailures}, client)
			before := testutil.ToFloat64(pollErrors)
			var err error
			for i := 0; i < tt.polls && err == nil; i++ {
				p.clock.Step(poll)
				err = p.run.pollOnce()
			}
			if tt.wantErr {
				g.Expect(err).To(MatchError(ContainSubstring("every DCGM read failed")))
			} else {
				g.Expect(err).NotTo(HaveOccurred())
			}
			g.Expect(testutil.ToFloat64(pollErrors)-before).To(BeNumerically(">=", tt.polls), "each failed read is counted")
		})
	}
}

func TestFailedHealthCheckResolvesNothing(t *testing.T) {
	g := NewWithT(t)
	client := newFakeClient()
	p := newPoller(t, Source{}, client)
	client.setIncidents(Incident{Code: HealthNVLinkCRCErrorThreshold, Entity: Entity{Kind: EntityGPU, ID: 0}})
	p.poll(0)
	g.Expect(p.rec.take()).To(HaveLen(1))

	client.mu.Lock()
	client.healthErr = errors.New("timeout")
	client.mu.Unlock()
	p.poll(poll)
	g.Expect(p.rec.take()).To(BeEmpty())
}

func TestDroppedViolations(t *testing.T) {
	g := NewWithT(t)
	client := newFakeClient()
	client.dropped = 5 // dropped before this run: not counted
	p := newPoller(t, Source{}, client)
	before := testutil.ToFloat64(droppedViolations)

	p.poll(0)
	g.Expect(testutil.ToFloat64(droppedViolations) - before).To(BeZero())

	client.mu.Lock()
	client.dropped = 12
	client.mu.Unlock()
	p.poll(poll)
	g.Expect(testutil.ToFloat64(droppedViolations) - before).To(Equal(7.0))
	p.poll(poll)
	g.Expect(testutil.ToFloat64(droppedViolations) - before).To(Equal(7.0))
}

// running is a Run in a goroutine.
type running struct {
	cancel   context.CancelFunc
	finished chan struct{}
	err      error // set before finished closes
}

// startRun runs src over client on a fake clock until the test ends or Run
// returns.
func startRun(t *testing.T, src Source, client *fakeClient, rec *recorder) *running {
	t.Helper()
	src.NewClient = client.newClient()
	if src.Clock == nil {
		src.Clock = clocktesting.NewFakeClock(testStart)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, finished: make(chan struct{})}
	go func() {
		r.err = src.Run(ctx, rec.report)
		close(r.finished)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.finished
	})
	return r
}

func TestRun(t *testing.T) {
	t.Run("an XID violation is reported as it arrives and counted by kind", func(t *testing.T) {
		g := NewWithT(t)
		policyViolations.Reset()
		client := newFakeClient()
		rec := &recorder{}
		startRun(t, Source{}, client, rec)

		client.violations <- Violation{Kind: ViolationXID, GPU: 1, XID: 79, Time: testStart}
		client.violations <- Violation{Kind: ViolationNVLink, GPU: 0, Field: FieldNVLinkReplayErrorTotal, Counter: 2}
		client.violations <- Violation{Kind: "thermal"}
		g.Eventually(func() float64 {
			return testutil.ToFloat64(policyViolations.WithLabelValues("other"))
		}).WithTimeout(5 * time.Second).Should(Equal(1.0))
		g.Expect(rec.take()).To(Equal([]monitors.Finding{
			{Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckXID, Component: gpuComponent("GPU-bbbb"), Code: "79"},
			{
				Source: gpuhealthv1alpha1.SourceDCGM, Check: gpuhealthv1alpha1.CheckNVLinkErrors, Component: gpuComponent("GPU-aaaa"),
				Code: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionRecertify,
			},
		}))
		g.Expect(testutil.ToFloat64(policyViolations.WithLabelValues("xid"))).To(Equal(1.0))
		g.Expect(testutil.ToFloat64(policyViolations.WithLabelValues("nvlink"))).To(Equal(1.0))
	})

	t.Run("Run polls on its ticker and connects with the configured settings", func(t *testing.T) {
		g := NewWithT(t)
		client := newFakeClient()
		rec := &recorder{}
		fc := clocktesting.NewFakeClock(testStart)
		startRun(t, Source{Mode: ModeStandalone, Address: "nv-hostengine.gpu-operator", Clock: fc}, client, rec)
		// The first poll runs at once, after the ticker exists.
		g.Eventually(client.polls).WithTimeout(5 * time.Second).Should(Equal(1))
		g.Expect(rec.all()).To(BeEmpty())

		client.setGlobal(FieldIMEXDomainStatus, "DOWN")
		fc.Step(poll)
		g.Eventually(client.polls).WithTimeout(5 * time.Second).Should(Equal(2))
		g.Eventually(rec.all).WithTimeout(5 * time.Second).Should(HaveLen(1))
		client.mu.Lock()
		defer client.mu.Unlock()
		g.Expect(client.config).To(Equal(ClientConfig{
			Mode:           ModeStandalone,
			Address:        "nv-hostengine.gpu-operator:5555",
			UpdateInterval: DefaultPollInterval,
			GPUFields:      wantGPUFields,
			GlobalFields:   imexFields,
			HealthSystems:  wantHealthSystems,
		}))
	})

	t.Run("a connect failure that wraps ErrUnavailable propagates", func(t *testing.T) {
		g := NewWithT(t)
		src := Source{NewClient: func(context.Context, ClientConfig) (Client, error) {
			return nil, monitors.Unavailable("libdcgm.so.4 not found")
		}}
		err := src.Run(context.Background(), (&recorder{}).report)
		g.Expect(err).To(MatchError(monitors.ErrUnavailable))
		g.Expect(err).To(MatchError(ContainSubstring("libdcgm.so.4 not found")))
	})

	t.Run("any other connect failure is not ErrUnavailable", func(t *testing.T) {
		g := NewWithT(t)
		src := Source{NewClient: func(context.Context, ClientConfig) (Client, error) {
			return nil, fmt.Errorf("starting DCGM: connection refused")
		}}
		err := src.Run(context.Background(), (&recorder{}).report)
		g.Expect(err).To(HaveOccurred())
		g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(BeFalse())
	})

	t.Run("the violation channel closing mid-run ends Run with an error and closes the client", func(t *testing.T) {
		g := NewWithT(t)
		client := newFakeClient()
		r := startRun(t, Source{}, client, &recorder{})
		close(client.violations)
		g.Eventually(r.finished).WithTimeout(5 * time.Second).Should(BeClosed())
		g.Expect(r.err).To(MatchError(ContainSubstring("policy violation channel closed")))
		g.Expect(errors.Is(r.err, monitors.ErrUnavailable)).To(BeFalse())
		g.Expect(client.isClosed()).To(BeTrue())
	})

	t.Run("a done context ends Run with nil and closes the client", func(t *testing.T) {
		g := NewWithT(t)
		client := newFakeClient()
		r := startRun(t, Source{}, client, &recorder{})
		r.cancel()
		g.Eventually(r.finished).WithTimeout(5 * time.Second).Should(BeClosed())
		g.Expect(r.err).NotTo(HaveOccurred())
		g.Expect(client.isClosed()).To(BeTrue())
	})

	t.Run("a bad configuration fails before connecting", func(t *testing.T) {
		g := NewWithT(t)
		client := newFakeClient()
		src := Source{Mode: "remote", NewClient: client.newClient()}
		g.Expect(src.Run(context.Background(), (&recorder{}).report)).To(MatchError(ContainSubstring(`unknown DCGM mode "remote"`)))
		g.Expect(client.config).To(BeZero())
	})
}

// wantGPUFields are the per-GPU fields the source watches, by DCGM's ids
// (dcgm_fields.h): the NVLink CRC flit, CRC data, replay and recovery error
// totals, DCGM_FI_DEV_GPU_RECOVERY_ACTION, and the slow-GPU signals: SM
// clock (100), clocks event reasons (112), max SM clock (113), GPU and
// slowdown temperature (150, 158), PCIe replays (202), GPU utilisation
// (203), PCIe max and current generation and width (235-238), power,
// thermal and reliability violation (240, 241, 245), volatile DBE total
// (311), pages pending retirement (392) and the row remap counts and flags
// (393-396).
var wantGPUFields = []Field{409, 419, 429, 439, 1523, 100, 112, 113, 150, 158, 202, 203, 235, 236, 237, 238, 240, 241, 245, 311, 392, 393, 394, 395, 396}

// wantHealthSystems are the health watches the source enables, by DCGM's
// bits (dcgmHealthSystems_t in dcgm_structs.h): PCIe 0x1, NVLink 0x2, memory
// 0x10, InfoROM 0x40, thermal 0x80, power 0x100, NVSwitch non-fatal 0x400,
// NVSwitch fatal 0x800 and IMEX 0x2000.
const wantHealthSystems HealthSystem = 0x1 | 0x2 | 0x10 | 0x40 | 0x80 | 0x100 | 0x400 | 0x800 | 0x2000

func TestSettings(t *testing.T) {
	tests := []struct {
		name       string
		source     Source
		wantClient ClientConfig
		wantErr    string
	}{
		{
			name:       "the zero Source runs DCGM embedded",
			source:     Source{},
			wantClient: ClientConfig{Mode: ModeEmbedded},
		},
		{
			name:       "embedded mode ignores the address",
			source:     Source{Mode: ModeEmbedded, Address: "somewhere:1"},
			wantClient: ClientConfig{Mode: ModeEmbedded},
		},
		{
			name:       "standalone without an address looks on the node",
			source:     Source{Mode: ModeStandalone},
			wantClient: ClientConfig{Mode: ModeStandalone, Address: "localhost:5555"},
		},
		{
			name:       "standalone keeps a host and port",
			source:     Source{Mode: ModeStandalone, Address: "10.0.0.7:6000"},
			wantClient: ClientConfig{Mode: ModeStandalone, Address: "10.0.0.7:6000"},
		},
		{
			name:       "standalone adds the default port to an IPv6 host",
			source:     Source{Mode: ModeStandalone, Address: "fd00::7"},
			wantClient: ClientConfig{Mode: ModeStandalone, Address: "[fd00::7]:5555"},
		},
		{
			name:       "standalone takes a path as a Unix socket",
			source:     Source{Mode: ModeStandalone, Address: "/run/nvidia/dcgm.sock"},
			wantClient: ClientConfig{Mode: ModeStandalone, Address: "/run/nvidia/dcgm.sock", UnixSocket: true},
		},
		{
			name:    "an unknown mode is an error",
			source:  Source{Mode: "remote"},
			wantErr: `unknown DCGM mode "remote"`,
		},
		{
			name:    "a negative threshold is an error",
			source:  Source{NVLinkThresholds: map[Field]float64{FieldNVLinkReplayErrorTotal: -1}},
			wantErr: "must not be negative",
		},
		{
			name:    "a threshold on a field that is not an NVLink total is an error",
			source:  Source{NVLinkThresholds: map[Field]float64{FieldIMEXDaemonStatus: 1}},
			wantErr: "only the NVLink total counters",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			st, err := tt.source.settings()
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			want := tt.wantClient
			want.UpdateInterval, want.GPUFields, want.GlobalFields = DefaultPollInterval, wantGPUFields, imexFields
			want.HealthSystems = wantHealthSystems
			g.Expect(st.client).To(Equal(want))
			g.Expect(st.window).To(Equal(DefaultWindow))
			g.Expect(st.repeat).To(Equal(DefaultRepeatInterval))
			g.Expect(st.maxPollFailures).To(Equal(DefaultMaxPollFailures))
		})
	}
}
