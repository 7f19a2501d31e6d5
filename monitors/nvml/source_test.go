package nvml

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
)

// These tests run the source through go-nvml's real code against the fake
// NVML library, one scenario at a time (NVML state is per process; each
// Init re-reads the scenario the environment names).

const (
	uuid0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
	uuid1 = "GPU-bbbbbbbb-1111-4000-8000-111111111111"
)

var library string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakenvml-")
	if err != nil {
		panic(err)
	}
	library, err = fakenvml.Build(dir)
	if err != nil {
		panic(err)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// recorder collects findings.
type recorder struct {
	mu       sync.Mutex
	findings []monitors.Finding
	started  time.Time
}

// all returns every finding so far.
func (r *recorder) all() []monitors.Finding {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]monitors.Finding(nil), r.findings...)
}

func (r *recorder) report(f monitors.Finding) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.findings = append(r.findings, f)
}

func (r *recorder) matching(check gpuhealthv1alpha1.Check, id, code string) []monitors.Finding {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []monitors.Finding
	for _, f := range r.findings {
		if f.Check == check && f.Component.ID == id && f.Code == code {
			out = append(out, f)
		}
	}
	return out
}

// run starts the source on a scenario and returns the recorder and a stop
// function that returns Run's error.
func run(t *testing.T, scenario string, s *Source) (*recorder, func() error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scenario.txt")
	if err := os.WriteFile(path, []byte(scenario), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakenvml.ScenarioEnv, path)
	if s.LibraryPath == "" {
		s.LibraryPath = library
	}
	if s.Log.GetSink() == nil {
		s.Log = logr.Discard()
	}
	if s.PollInterval == 0 {
		s.PollInterval = 50 * time.Millisecond
	}
	r := &recorder{started: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, r.report) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return r, stop
}

const twoGPUs = `device index=0 uuid=` + uuid0 + ` pci=0000:3b:00.0 links=2
device index=1 uuid=` + uuid1 + ` pci=0000:5e:00.0 links=2
`

func TestLinkDownIsReportedAndResolved(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+"linkstate device=0 link=1 state=down at=300ms\nlinkstate device=0 link=1 state=up at=1s\n", &Source{})
	link := uuid0 + "/link-1"
	g.Eventually(func() []monitors.Finding { return r.matching(gpuhealthv1alpha1.CheckNVLinkDown, link, LinkDown) }, 5*time.Second).Should(HaveLen(2))
	got := r.matching(gpuhealthv1alpha1.CheckNVLinkDown, link, LinkDown)
	g.Expect(got[0].Resolved).To(BeFalse())
	g.Expect(got[0].Component.Kind).To(Equal(gpuhealthv1alpha1.ComponentNVLink))
	g.Expect(got[1].Resolved).To(BeTrue())
	g.Expect(r.matching(gpuhealthv1alpha1.CheckNVLinkDown, uuid0+"/link-0", LinkDown)).To(BeEmpty(), "only the link that went down")
	g.Expect(stop()).To(Succeed())
}

// "Watching GPUs" is what operators and the process tests wait for; an XID
// raised the moment it is logged must arrive, so the event set has to be
// registered before the line is written.
func TestXIDRaisedAsWatchingIsLoggedArrives(t *testing.T) {
	g := NewWithT(t)
	var injected atomic.Bool
	s := &Source{Log: funcr.New(func(_, args string) {
		if strings.Contains(args, "Watching GPUs through NVML") {
			// Into the scenario file run wrote; the library re-reads it.
			appendFile(t, os.Getenv(fakenvml.ScenarioEnv), fmt.Sprintf("xid device=0 code=79 at=%s\n", fakenvml.At(time.Now())))
			injected.Store(true)
		}
	}, funcr.Options{})}
	r, stop := run(t, twoGPUs, s)
	g.Eventually(injected.Load, 5*time.Second).Should(BeTrue())
	g.Eventually(func() []monitors.Finding { return r.matching(gpuhealthv1alpha1.CheckXID, uuid0, "79") }, 5*time.Second).Should(HaveLen(1))
	g.Expect(stop()).To(Succeed())
}

func appendFile(t *testing.T, path, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Error(err)
		return
	}
	defer func() { _ = f.Close() }()
	if _, err := f.WriteString(data); err != nil {
		t.Error(err)
	}
}

func TestLostGPUIsReportedOnce(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+"lost device=1 at=300ms\n", &Source{})
	g.Eventually(func() []monitors.Finding { return r.matching(gpuhealthv1alpha1.CheckGPULost, uuid1, "GPU_IS_LOST") }, 5*time.Second).Should(HaveLen(1))
	g.Consistently(func() []monitors.Finding { return r.matching(gpuhealthv1alpha1.CheckGPULost, uuid1, "GPU_IS_LOST") }, 500*time.Millisecond).Should(HaveLen(1))
	g.Expect(r.matching(gpuhealthv1alpha1.CheckGPULost, uuid0, "GPU_IS_LOST")).To(BeEmpty())
	g.Expect(stop()).To(Succeed())
}

func TestFabricTrainingAfterBootIsGivenGrace(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+"fabric device=0 state=in_progress\nfabric device=1 state=completed health=healthy\n",
		&Source{FabricGrace: time.Second})
	inProgress := func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckFabric, uuid0, FabricInProgress)
	}
	g.Consistently(inProgress, 600*time.Millisecond).Should(BeEmpty(), "training within the grace period is normal")
	g.Eventually(inProgress, 5*time.Second).Should(HaveLen(1), "still training after the grace period is a finding")
	g.Expect(inProgress()[0].Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
	g.Expect(stop()).To(Succeed())
}

func TestFabricThatFallsBackIsAFindingAtOnce(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+"fabric device=1 state=completed health=healthy\nfabric device=1 state=not_started at=300ms\nfabric device=1 state=completed health=limited_capacity at=1s\n",
		&Source{FabricGrace: time.Hour})
	g.Eventually(func() []monitors.Finding { return r.matching(gpuhealthv1alpha1.CheckFabric, uuid1, FabricNotStarted) }, 5*time.Second).ShouldNot(BeEmpty())
	g.Eventually(func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckFabric, uuid1, FabricLimitedCapacity)
	}, 5*time.Second).ShouldNot(BeEmpty())
	notStarted := r.matching(gpuhealthv1alpha1.CheckFabric, uuid1, FabricNotStarted)
	g.Expect(notStarted[len(notStarted)-1].Resolved).To(BeTrue(), "the old state resolves when the state changes")
	g.Expect(r.matching(gpuhealthv1alpha1.CheckFabric, uuid1, FabricLimitedCapacity)[0].Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
	g.Expect(stop()).To(Succeed())
}

func TestCounterResetIsNotABurst(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+"nvlink device=0 link=0 counter=crc_flit value=100000000 at=0s\nnvlink device=0 link=0 counter=crc_flit value=0 at=300ms\n",
		&Source{Window: 500 * time.Millisecond, Thresholds: map[Counter]float64{CounterCRCFlit: 10}})
	g.Consistently(func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckNVLinkErrors, uuid0+"/link-0", string(CounterCRCFlit))
	}, time.Second).Should(BeEmpty())
	g.Expect(stop()).To(Succeed())
}

func TestResolvePCIMapsKernelBusIDsToUUIDs(t *testing.T) {
	g := NewWithT(t)
	s := &Source{}
	_, stop := run(t, twoGPUs, s)
	g.Eventually(func() bool { _, ok := s.ResolvePCI("0000:5e:00.0"); return ok }, 5*time.Second).Should(BeTrue())
	uuid, _ := s.ResolvePCI("0000:5E:00.0")
	g.Expect(uuid).To(Equal(uuid1))
	_, ok := s.ResolvePCI("0000:99:00.0")
	g.Expect(ok).To(BeFalse())
	g.Expect(stop()).To(Succeed())
}

func TestMissingLibraryMakesTheSourceUnavailable(t *testing.T) {
	g := NewWithT(t)
	s := &Source{LibraryPath: filepath.Join(t.TempDir(), "libnvidia-ml.so.1")}
	err := s.Run(context.Background(), func(monitors.Finding) {})
	g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(BeTrue(), "got %v", err)
}

// TestSourceRunsOnceTheDriverArrives: the agent tries an unavailable source
// again; the same Source, unavailable while the library is missing, runs
// and sees XIDs once the driver's library appears (a driver container that
// finished installing after the agent started).
func TestSourceRunsOnceTheDriverArrives(t *testing.T) {
	g := NewWithT(t)
	path := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	s := &Source{LibraryPath: path}
	err := s.Run(context.Background(), func(monitors.Finding) {})
	g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(BeTrue(), "got %v", err)

	lib, err := os.ReadFile(library)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(path, lib, 0o755)).To(Succeed())
	r, stop := run(t, twoGPUs+"xid device=1 code=79 at=500ms\n", s)
	g.Eventually(func() []monitors.Finding { return r.matching(gpuhealthv1alpha1.CheckXID, uuid1, "79") }, 5*time.Second).Should(HaveLen(1))
	g.Expect(stop()).To(Succeed())
}

func TestNormalizeBusID(t *testing.T) {
	g := NewWithT(t)
	g.Expect(NormalizeBusID("00000000:3B:00.0")).To(Equal("0000:3b:00.0"))
	g.Expect(NormalizeBusID("0000:3b:00.0")).To(Equal("0000:3b:00.0"))
}

// TestGPUsNVMLDoesNotListAreMissing: the PCI bus has three GPUs and NVML
// lists two: one GPUMissing finding naming the third; with none listed at
// all the finding comes before the source says it is unavailable; a bus
// that agrees resolves it at the start (after the reboot that fixed it).
func TestGPUsNVMLDoesNotListAreMissing(t *testing.T) {
	g := NewWithT(t)
	bus := []string{"0000:3b:00.0", "0000:5e:00.0", "0000:af:00.0"}
	pci := func(b []string) func() ([]string, error) { return func() ([]string, error) { return b, nil } }
	missing := func(r *recorder) []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckGPUMissing, "", GPUMissingPCI)
	}

	r, stop := run(t, twoGPUs, &Source{PCIGPUs: pci(bus)})
	g.Eventually(func() []monitors.Finding { return missing(r) }, 5*time.Second).Should(HaveLen(1))
	f := missing(r)[0]
	g.Expect(f.Resolved).To(BeFalse())
	g.Expect(f.Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
	g.Expect(f.Action).To(Equal(gpuhealthv1alpha1.ActionRebootNode))
	g.Expect(f.Message).To(Equal("NVML lists 2 GPUs, the PCI bus has 3 NVIDIA GPUs; not in NVML: 0000:af:00.0"))
	g.Expect(stop()).To(Succeed())

	r, stop = run(t, twoGPUs, &Source{PCIGPUs: pci(bus[:2])})
	g.Eventually(func() []monitors.Finding { return missing(r) }, 5*time.Second).Should(HaveLen(1))
	g.Expect(missing(r)[0].Resolved).To(BeTrue(), "all listed: the finding an earlier run left is resolved")
	g.Expect(stop()).To(Succeed())

	none := &recorder{}
	path := filepath.Join(t.TempDir(), "scenario.txt")
	g.Expect(os.WriteFile(path, []byte("# the driver initialised no GPU\n"), 0o600)).To(Succeed())
	t.Setenv(fakenvml.ScenarioEnv, path)
	err := (&Source{LibraryPath: library, PCIGPUs: pci(bus), Log: logr.Discard()}).Run(context.Background(), none.report)
	g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(BeTrue(), "got %v", err)
	g.Expect(missing(none)).To(HaveLen(1))
	g.Expect(missing(none)[0].Message).To(ContainSubstring("NVML lists 0 GPUs, the PCI bus has 3"))
}
