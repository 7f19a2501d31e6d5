package dcgm

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/monitors"
)

// fakeClient is a Client whose answers the test sets. It is safe for
// concurrent use, so a test may change it while Run polls.
type fakeClient struct {
	mu         sync.Mutex
	gpus       []GPU
	gpuValues  map[uint]map[Field]FieldValue
	global     map[Field]FieldValue
	incidents  []Incident
	dropped    uint64
	valuesErr  error
	globalErr  error
	healthErr  error
	violations chan Violation
	config     ClientConfig
	closed     bool
	// healthChecks counts HealthCheck calls, one per poll.
	healthChecks int
}

var _ Client = (*fakeClient)(nil)

// newFakeClient returns a client with two GPUs and no values.
func newFakeClient() *fakeClient {
	return &fakeClient{
		gpus: []GPU{
			{ID: 0, UUID: "GPU-aaaa", PCIBusID: "00000000:3B:00.0"},
			{ID: 1, UUID: "GPU-bbbb", PCIBusID: "00000000:86:00.0"},
		},
		gpuValues:  map[uint]map[Field]FieldValue{},
		global:     map[Field]FieldValue{},
		violations: make(chan Violation, 16),
	}
}

// newClient returns a NewClientFunc that hands out c and records the config.
func (c *fakeClient) newClient() NewClientFunc {
	return func(_ context.Context, cfg ClientConfig) (Client, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.config = cfg
		return c, nil
	}
}

// setCounter sets a GPU's integer field.
func (c *fakeClient) setCounter(gpu uint, f Field, v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gpuValues[gpu] == nil {
		c.gpuValues[gpu] = map[Field]FieldValue{}
	}
	c.gpuValues[gpu][f] = FieldValue{Field: f, Valid: true, Int: v}
}

// setGlobal sets a global field; a nil value makes it not valid.
func (c *fakeClient) setGlobal(f Field, v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch v := v.(type) {
	case string:
		c.global[f] = FieldValue{Field: f, Valid: true, String: v}
	case int:
		c.global[f] = FieldValue{Field: f, Valid: true, Int: int64(v)}
	default:
		delete(c.global, f)
	}
}

// setIncidents sets what the next health checks return.
func (c *fakeClient) setIncidents(in ...Incident) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.incidents = in
}

func (c *fakeClient) GPUs() ([]GPU, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gpus, nil
}

func (c *fakeClient) PolicyViolations(context.Context) (<-chan Violation, error) {
	return c.violations, nil
}

func (c *fakeClient) GPUValues(gpu uint, fields []Field) ([]FieldValue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.valuesErr != nil {
		return nil, c.valuesErr
	}
	out := make([]FieldValue, len(fields))
	for i, f := range fields {
		out[i] = FieldValue{Field: f}
		if v, ok := c.gpuValues[gpu][f]; ok {
			out[i] = v
		}
	}
	return out, nil
}

func (c *fakeClient) GlobalValues(fields []Field) ([]FieldValue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.globalErr != nil {
		return nil, c.globalErr
	}
	out := make([]FieldValue, len(fields))
	for i, f := range fields {
		out[i] = FieldValue{Field: f}
		if v, ok := c.global[f]; ok {
			out[i] = v
		}
	}
	return out, nil
}

func (c *fakeClient) HealthCheck() ([]Incident, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.healthChecks++
	if c.healthErr != nil {
		return nil, c.healthErr
	}
	return append([]Incident(nil), c.incidents...), nil
}

func (c *fakeClient) DroppedViolations() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

func (c *fakeClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *fakeClient) polls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.healthChecks
}

func (c *fakeClient) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// recorder collects reported findings.
type recorder struct {
	mu       sync.Mutex
	findings []monitors.Finding
}

func (r *recorder) report(f monitors.Finding) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.findings = append(r.findings, f)
}

// take returns the findings reported since the last take, with Time and
// Message cleared so that tests compare what matters.
func (r *recorder) take() []monitors.Finding {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.findings
	r.findings = nil
	for i := range out {
		out[i].Time, out[i].Message = time.Time{}, ""
	}
	return out
}

// all returns the findings reported so far, untouched.
func (r *recorder) all() []monitors.Finding {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]monitors.Finding(nil), r.findings...)
}

// testStart is the fake clock's start.
var testStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// poller drives one run's polls by hand on a fake clock.
type poller struct {
	t      *testing.T
	client *fakeClient
	clock  *clocktesting.FakeClock
	rec    *recorder
	run    *run
}

// newPoller builds a run of src (its NewClient and Clock are replaced) over
// client, without starting Run's loop.
func newPoller(t *testing.T, src Source, client *fakeClient) *poller {
	t.Helper()
	g := NewWithT(t)
	fc := clocktesting.NewFakeClock(testStart)
	src.Clock = fc
	st, err := src.settings()
	g.Expect(err).NotTo(HaveOccurred())
	rec := &recorder{}
	r, err := newRun(st, client, rec.report, logr.Discard())
	g.Expect(err).NotTo(HaveOccurred())
	return &poller{t: t, client: client, clock: fc, rec: rec, run: r}
}

// poll steps the clock by d (none for 0) and polls once.
func (p *poller) poll(d time.Duration) {
	p.t.Helper()
	p.clock.Step(d)
	NewWithT(p.t).Expect(p.run.pollOnce()).To(Succeed())
}
