package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/nodefindings"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var env *testenv.Env

// alice is a user (client certificate, cluster-admin) the plugin runs as.
var alice *rest.Config

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		env = e
		ctx := context.Background()
		if err := fleet(ctx, e.Client); err != nil {
			return err
		}
		user, err := e.Environment.AddUser(envtest.User{Name: "alice", Groups: []string{"system:masters"}}, nil)
		if err != nil {
			return fmt.Errorf("adding user alice: %w", err)
		}
		alice = user.Config()
		return installRequestPolicy(ctx, e.Client)
	}))
}

// installRequestPolicy applies the chart's admission policy on manual
// requests, so that the plugin's writes meet it, and waits until the
// apiserver enforces it (it loads policies from an informer).
func installRequestPolicy(ctx context.Context, c client.Client) error {
	data, err := os.ReadFile(filepath.Join("..", "..", "charts", "gpuhealth", "files", "request_policy.yaml"))
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			return fmt.Errorf("decoding the request policy: %w", err)
		}
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("applying %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	// A server-side dry run goes through admission and changes nothing.
	probe := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"request":{"action":"Recertify","id":"probe","requestedBy":"nobody"}}}`))
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := c.Patch(ctx, &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0"}}, probe, client.DryRunAll)
		return apierrors.IsForbidden(err), nil
	})
}

// now is the fixture fleet's present.
var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

func agoP(d time.Duration) *metav1.Time { t := ago(d); return &t }

// plugin runs one command line against the test control plane with the
// fixture's clock, and returns its output and exit code.
func plugin(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return pluginAs(t, env.Config, args...)
}

// pluginAs is plugin with the credentials of cfg.
func pluginAs(t *testing.T, cfg *rest.Config, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	g := &globals{
		config:     genericclioptions.NewConfigFlags(false),
		streams:    genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
		now:        func() time.Time { return now },
		restConfig: cfg,
		poll:       50 * time.Millisecond,
	}
	code := run(context.Background(), g, args)
	return out.String(), errOut.String(), code
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s (go test -update writes it): %v", path, err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

func TestStatusGolden(t *testing.T) {
	out, errOut, code := plugin(t, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	golden(t, "status", out)
	out, _, _ = plugin(t, "status", "-o", "wide")
	golden(t, "status-wide", out)
}

func TestStatusJSON(t *testing.T) {
	g := NewWithT(t)
	out, errOut, code := plugin(t, "status", "-o", "json", "--failed", "1")
	g.Expect(code).To(Equal(0), errOut)
	g.Expect(out).To(ContainSubstring(`"failedTotal": 2`))
	g.Expect(out).To(ContainSubstring(`"name": "gpu-3"`), "the oldest Failed node first")
	g.Expect(out).NotTo(ContainSubstring(`"name": "gpu-2"`))
	g.Expect(out).To(ContainSubstring(`"clique": "c1.0"`))
	var st FleetStatus
	g.Expect(json.Unmarshal([]byte(out), &st)).To(Succeed())
	g.Expect(st.Drift).To(HaveLen(2))
	g.Expect(st.Drift[0].Properties).To(Equal([]DriftedProperty{{Property: gpuhealthv1alpha1.DriftDriver, Majority: "570.133.20", Agree: 4, Reporting: 5,
		Outliers: []DriftOutlier{{Node: "gpu-2", Value: "570.86.15"}}}}), "gpu-2's driver is not its pool's")
}

func TestStoryGolden(t *testing.T) {
	out, errOut, code := plugin(t, "story", "gpu-1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	golden(t, "story-gpu-1", out)
}

func TestFindings(t *testing.T) {
	g := NewWithT(t)
	out, _, code := plugin(t, "findings", "--active")
	g.Expect(code).To(Equal(0))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	g.Expect(lines).To(HaveLen(3), out)
	g.Expect(lines[1]).To(HavePrefix("gpu-4"), "the latest seen first")
	g.Expect(out).NotTo(ContainSubstring("Resolved"))
	out, _, _ = plugin(t, "findings", "gpu-1")
	g.Expect(strings.Split(strings.TrimSpace(out), "\n")).To(HaveLen(3), out)
}

func TestErrorsNameTheObjectAndTheFix(t *testing.T) {
	g := NewWithT(t)
	_, errOut, code := plugin(t, "story", "no-such-node")
	g.Expect(code).To(Equal(1))
	g.Expect(errOut).To(ContainSubstring(`nodehealth "no-such-node" not found`))
	g.Expect(errOut).To(ContainSubstring("kubectl get remediationpolicies"))

	_, errOut, code = plugin(t, "release", "gpu-2")
	g.Expect(code).To(Equal(1))
	g.Expect(errOut).To(ContainSubstring("give a --reason"))

	_, errOut, code = plugin(t, "status", "-o", "xml")
	g.Expect(code).To(Equal(1))
	g.Expect(errOut).To(ContainSubstring(`unknown output format "xml"`))
}

func TestReleaseWritesTheRequestAndWaits(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	// A fake operator: carry out whatever request appears on gpu-6.
	stop := fakeOperator(t, "gpu-6")
	defer stop()

	id := uniqueID("INC")
	out, errOut, code := pluginAs(t, alice, "release", "gpu-6", "--reason", "false alarm", "--id", id, "--wait", "--timeout", "20s")
	g.Expect(code).To(Equal(0), errOut)
	g.Expect(out).To(ContainSubstring("nodehealth/gpu-6: set spec.request to Release id=" + id + ` reason="false alarm" requestedBy=alice.`))
	g.Expect(out).To(ContainSubstring("returns the node to Healthy without recertification"))
	g.Expect(out).To(ContainSubstring("request " + id + " carried out"))

	nh := &gpuhealthv1alpha1.NodeHealth{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "gpu-6"}, nh)).To(Succeed())
	g.Expect(nh.Spec.Request).To(Equal(&gpuhealthv1alpha1.ManualRequest{
		Action: gpuhealthv1alpha1.RequestRelease, ID: id, Reason: "false alarm", RequestedBy: "alice"}))
	g.Expect(managers(nh)).To(ContainElement(fieldManager))

	_, errOut, code = plugin(t, "release", "gpu-6", "--reason", "again", "--id", id)
	g.Expect(code).To(Equal(1))
	g.Expect(errOut).To(ContainSubstring("use a new --id"))
}

func TestRequestsNameTheAuthenticatedUser(t *testing.T) {
	ctx := context.Background()
	// The name the apiserver gives envtest's admin, whatever it is.
	review := &authenticationv1.SelfSubjectReview{}
	NewWithT(t).Expect(env.Client.Create(ctx, review)).To(Succeed())
	adminUser := review.Status.UserInfo.Username
	cases := []struct {
		name string
		as   *rest.Config
		args []string
		// wantBy is the request's requestedBy; "": the plugin refuses
		// with wantErr and writes nothing.
		wantBy  string
		wantErr string
	}{
		{name: "alice's request names alice", as: alice, wantBy: "alice"},
		{name: "the admin's request names the admin", as: env.Config, wantBy: adminUser},
		{name: "alice may still say --requested-by alice", as: alice, args: []string{"--requested-by", "alice"}, wantBy: "alice"},
		{
			name: "alice may not say --requested-by bob", as: alice, args: []string{"--requested-by", "bob"},
			wantErr: "--requested-by bob: a request names the user you are authenticated as, alice, and the apiserver refuses any other name",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			before := &gpuhealthv1alpha1.NodeHealth{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "gpu-7"}, before)).To(Succeed())
			id := uniqueID("who")
			_, errOut, code := pluginAs(t, tc.as, append([]string{"recertify", "gpu-7", "--id", id}, tc.args...)...)
			after := &gpuhealthv1alpha1.NodeHealth{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "gpu-7"}, after)).To(Succeed())
			if tc.wantErr != "" {
				g.Expect(code).To(Equal(1))
				g.Expect(errOut).To(ContainSubstring(tc.wantErr))
				g.Expect(after.Spec.Request).To(Equal(before.Spec.Request), "nothing written")
				return
			}
			g.Expect(code).To(Equal(0), errOut)
			g.Expect(after.Spec.Request).To(Equal(&gpuhealthv1alpha1.ManualRequest{
				Action: gpuhealthv1alpha1.RequestRecertify, ID: id, RequestedBy: tc.wantBy}))
		})
	}
}

func TestWaitTimesOutWithExitCode2(t *testing.T) {
	g := NewWithT(t)
	id := uniqueID("r")
	_, errOut, code := plugin(t, "recertify", "gpu-7", "--id", id, "--wait", "--timeout", "300ms")
	g.Expect(code).To(Equal(2))
	g.Expect(errOut).To(ContainSubstring("timed out after 300ms waiting for the operator to carry out request " + id))
	nh := &gpuhealthv1alpha1.NodeHealth{}
	g.Expect(env.Client.Get(context.Background(), client.ObjectKey{Name: "gpu-7"}, nh)).To(Succeed())
	g.Expect(nh.Spec.Request.Action).To(Equal(gpuhealthv1alpha1.RequestRecertify))
}

func TestMaintenanceDryRunChangesNothing(t *testing.T) {
	g := NewWithT(t)
	out, errOut, code := plugin(t, "maintenance", "gpu-0", "--reason", "BMC firmware", "--id", "CHG-77", "--dry-run")
	g.Expect(code).To(Equal(0), errOut)
	g.Expect(out).To(ContainSubstring("holds it in phase Maintenance"))
	g.Expect(out).To(ContainSubstring("dry run: nothing changed"))
	nh := &gpuhealthv1alpha1.NodeHealth{}
	g.Expect(env.Client.Get(context.Background(), client.ObjectKey{Name: "gpu-0"}, nh)).To(Succeed())
	g.Expect(nh.Spec.Request).To(BeNil())
}

func TestApproveNeedsAReasonAndSaysWhatItDoes(t *testing.T) {
	g := NewWithT(t)
	_, errOut, code := plugin(t, "approve", "gpu-0", "--id", "CHG-78")
	g.Expect(code).NotTo(Equal(0))
	g.Expect(errOut).To(ContainSubstring("reason"))
	out, errOut, code := plugin(t, "approve", "gpu-0", "--reason", "reboot agreed", "--id", "CHG-78", "--dry-run")
	g.Expect(code).To(Equal(0), errOut)
	g.Expect(out).To(ContainSubstring("status.approval"))
	g.Expect(out).To(ContainSubstring("dry run: nothing changed"))
}

func TestHoldExcludeAndBack(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	get := func() gpuhealthv1alpha1.NodeHealthSpec {
		nh := &gpuhealthv1alpha1.NodeHealth{}
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "gpu-5"}, nh)).To(Succeed())
		return nh.Spec
	}
	out, errOut, code := plugin(t, "hold", "gpu-5")
	g.Expect(code).To(Equal(0), errOut)
	g.Expect(out).To(ContainSubstring("set spec.hold to true"))
	g.Expect(get().Hold).To(BeTrue())

	_, errOut, code = plugin(t, "exclude", "gpu-5")
	g.Expect(code).To(Equal(1))
	g.Expect(errOut).To(ContainSubstring("unhold gpu-5 first"))

	_, _, code = plugin(t, "unhold", "gpu-5")
	g.Expect(code).To(Equal(0))
	g.Expect(get().Hold).To(BeFalse())

	_, _, code = plugin(t, "exclude", "gpu-5")
	g.Expect(code).To(Equal(0))
	g.Expect(get().Exclude).To(BeTrue())
	out, _, _ = plugin(t, "exclude", "gpu-5")
	g.Expect(out).To(ContainSubstring("already true; nothing changed"))
	_, _, code = plugin(t, "include", "gpu-5")
	g.Expect(code).To(Equal(0))
	g.Expect(get().Exclude).To(BeFalse())
}

func TestResetBreaker(t *testing.T) {
	g := NewWithT(t)
	_, errOut, code := plugin(t, "reset-breaker", "default")
	g.Expect(code).To(Equal(1))
	g.Expect(errOut).To(ContainSubstring("give a --reason"))
	out, errOut, code := plugin(t, "reset-breaker", "default", "--reason", "bad driver push")
	g.Expect(code).To(Equal(0), errOut)
	g.Expect(out).To(ContainSubstring("The breaker is Open"))
	p := &gpuhealthv1alpha1.RemediationPolicy{}
	g.Expect(env.Client.Get(context.Background(), client.ObjectKey{Name: "default"}, p)).To(Succeed())
	g.Expect(p.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation]).To(Equal("2026-12-01T12:00:00Z bad driver push"))
}

// uniqueID is a request id not used before in this process, so that the
// tests can run more than once against one control plane (-count).
func uniqueID(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

func managers(o client.Object) []string {
	var out []string
	for _, m := range o.GetManagedFields() {
		out = append(out, m.Manager)
	}
	return out
}

// fakeOperator records every new request on node as carried out, as the
// operator does, until stopped.
func fakeOperator(t *testing.T, node string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			nh := &gpuhealthv1alpha1.NodeHealth{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, nh); err == nil && nh.Spec.Request != nil &&
				(nh.Status.LastRequest == nil || nh.Status.LastRequest.ID != nh.Spec.Request.ID) {
				nh.Status.LastRequest = &gpuhealthv1alpha1.HandledRequest{ID: nh.Spec.Request.ID, Action: nh.Spec.Request.Action,
					Time: metav1.Now(), Result: "returned to service"}
				nh.Status.Phase = gpuhealthv1alpha1.PhaseHealthy
				if err := env.Client.Status().Update(ctx, nh); err != nil {
					t.Logf("fake operator: %v", err)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() { cancel(); <-done }
}

// fleet creates the fixture: a policy, eight nodes in two pools with
// their NodeInventories and their NodeHealths in several phases, findings,
// a Job and an Event.
func fleet(ctx context.Context, c client.Client) error {
	mk := func(o client.Object) error { return c.Create(ctx, o) }
	status := func(o client.Object) error { return c.Status().Update(ctx, o) }

	def := &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{Drift: &gpuhealthv1alpha1.DriftSpec{}}}
	if err := mk(def); err != nil {
		return err
	}
	def.Status = gpuhealthv1alpha1.RemediationPolicyStatus{
		ObservedGeneration: 1, ManagedNodes: 8,
		Phases: map[gpuhealthv1alpha1.NodeHealthPhase]int32{"Healthy": 3, "Draining": 1, "Failed": 2, "Quarantined": 2},
		Budget: &gpuhealthv1alpha1.BudgetStatus{Limit: 1, Unavailable: 1, Waiting: 2},
		CircuitBreaker: &gpuhealthv1alpha1.CircuitBreakerStatus{State: gpuhealthv1alpha1.BreakerOpen, Since: agoP(7 * time.Minute),
			QuarantinesInWindow: 4, Message: "4 quarantines in 10m0s reached the threshold of 3"},
	}
	if err := status(def); err != nil {
		return err
	}

	// Two pools: six H100 nodes, of which gpu-2 runs an older driver and
	// gpu-5's monitor has not reported, and two H200 nodes.
	products := map[string]string{"gpu-6": "NVIDIA-H200", "gpu-7": "NVIDIA-H200"}
	drivers := map[string]string{"gpu-0": "570.133.20", "gpu-1": "570.133.20", "gpu-2": "570.86.15", "gpu-3": "570.133.20",
		"gpu-4": "570.133.20", "gpu-6": "570.133.20", "gpu-7": "570.133.20"}
	for _, n := range []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"} {
		products[n] = "NVIDIA-H100-80GB-HBM3"
	}
	type fixture struct {
		name, clique string
		phase        gpuhealthv1alpha1.NodeHealthPhase
		reason, msg  string
		since        time.Duration
	}
	for _, f := range []fixture{
		{"gpu-0", "", gpuhealthv1alpha1.PhaseHealthy, "NoFindings", "", 48 * time.Hour},
		{"gpu-1", "c1.0", gpuhealthv1alpha1.PhaseDraining, "DrainInProgress", "2 of 3 pods remain; 1 blocked by PodDisruptionBudget train/trainer-pdb", 3 * time.Minute},
		{"gpu-2", "", gpuhealthv1alpha1.PhaseFailed, "RecertificationExhausted", "3 attempts failed: dcgm-diag memory test", 2 * time.Hour},
		{"gpu-3", "", gpuhealthv1alpha1.PhaseFailed, "ReplaceNode", "XID 79: the GPU fell off the bus", 26 * time.Hour},
		{"gpu-4", "c1.0", gpuhealthv1alpha1.PhaseQuarantined, "WaitingForBudget", "maxUnavailable 1 of 1 used", time.Minute},
		{"gpu-5", "", gpuhealthv1alpha1.PhaseHealthy, "NoFindings", "", 30 * time.Hour},
		{"gpu-6", "", gpuhealthv1alpha1.PhaseQuarantined, "WaitingForBudget", "maxUnavailable 1 of 1 used", time.Minute},
		{"gpu-7", "", gpuhealthv1alpha1.PhaseHealthy, "NoFindings", "", 30 * time.Hour},
	} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.name, Labels: map[string]string{"nvidia.com/gpu.present": "true", nodefindings.ProductLabel: products[f.name]}}}
		if f.clique != "" {
			n.Labels["nvidia.com/gpu.clique"] = f.clique
		}
		if err := inventory(ctx, c, f.name, products[f.name], drivers[f.name]); err != nil {
			return err
		}
		if f.phase != gpuhealthv1alpha1.PhaseHealthy {
			n.Spec.Unschedulable = true
			n.Spec.Taints = []corev1.Taint{{Key: "gpuhealth.dev/quarantined", Effect: corev1.TaintEffectNoSchedule}}
		}
		if err := mk(n); err != nil {
			return err
		}
		nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: f.name}}
		if err := mk(nh); err != nil {
			return err
		}
		nh.Status = gpuhealthv1alpha1.NodeHealthStatus{Phase: f.phase, Reason: f.reason, Message: f.msg, Since: agoP(f.since), ObservedGeneration: 1}
		if f.name == "gpu-1" {
			nh.Status.History = []gpuhealthv1alpha1.Transition{
				{To: gpuhealthv1alpha1.PhaseHealthy, Reason: "Registered", Time: ago(72 * time.Hour)},
				{From: gpuhealthv1alpha1.PhaseHealthy, To: gpuhealthv1alpha1.PhaseQuarantined, Reason: "FatalFinding", Message: "XID 79 on GPU 3", Time: ago(5 * time.Minute)},
				{From: gpuhealthv1alpha1.PhaseQuarantined, To: gpuhealthv1alpha1.PhaseDraining, Reason: "BudgetAvailable", Time: ago(3 * time.Minute)},
			}
			nh.Status.Drain = &gpuhealthv1alpha1.DrainStatus{StartedAt: agoP(3 * time.Minute), PodsTotal: 3, PodsRemaining: 2, PodsBlocked: 1,
				Blocked: []gpuhealthv1alpha1.BlockedPod{{Namespace: "train", Name: "trainer-7", PodDisruptionBudget: "trainer-pdb", Message: "Cannot evict pod as it would violate the pod's disruption budget."}},
				Gangs: []gpuhealthv1alpha1.GangWave{{Kind: "JobSet", Namespace: "train", Name: "llm", Part: "0", Owner: "JobSet llm", Size: 16, SpannedNodes: 16,
					Nodes: []string{"gpu-1", "gpu-2", "gpu-3", "gpu-4"}, EvictedAt: agoP(3 * time.Minute)}}}
			nh.Status.ComputeDomain = &gpuhealthv1alpha1.ComputeDomainMembership{UID: "5b0c3a9e-1111-4d6e-9c1a-2f7f00000001", Namespace: "train", Name: "llm-run",
				CliqueID: "c1.0", Membership: gpuhealthv1alpha1.MembershipLeaving, DomainStatus: "Ready",
				Traces: []gpuhealthv1alpha1.MembershipTrace{gpuhealthv1alpha1.TraceDaemonPod}}
			nh.Status.Outage = &gpuhealthv1alpha1.Outage{Since: ago(5 * time.Minute), Cause: gpuhealthv1alpha1.OutageFault, Check: gpuhealthv1alpha1.CheckXID, Code: "79", Action: gpuhealthv1alpha1.ActionResetGPU}
			nh.Status.Conditions = []metav1.Condition{{Type: "Drained", Status: metav1.ConditionFalse, Reason: "PodsRemain", Message: "2 pods remain", LastTransitionTime: ago(3 * time.Minute)}}
		}
		if f.name == "gpu-5" {
			// One GPU out of service alone on a node in service.
			nh.Status.Devices = []gpuhealthv1alpha1.DeviceStatus{{UUID: "GPU-5d2c1e00-0003", Driver: "gpu.nvidia.com", Pool: "gpu-5", Device: "gpu-3",
				Phase: gpuhealthv1alpha1.DeviceDraining, Since: ago(2 * time.Minute), OutSince: ago(3 * time.Minute), Class: "xid-48", Rule: "gpuhealth-gpu-5-gpu-3"}}
			nh.Status.DevicesOut = 1
		}
		if err := status(nh); err != nil {
			return err
		}
	}

	type finding struct {
		node, code  string
		check       gpuhealthv1alpha1.Check
		sev         gpuhealthv1alpha1.Severity
		phase       gpuhealthv1alpha1.EventPhase
		verdict     gpuhealthv1alpha1.Verdict
		count       int64
		first, last time.Duration
		source      gpuhealthv1alpha1.Source
		kind        gpuhealthv1alpha1.ComponentKind
	}
	for _, f := range []finding{
		{"gpu-1", "79", gpuhealthv1alpha1.CheckXID, gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.EventActive, gpuhealthv1alpha1.VerdictQuarantine, 2, 5 * time.Minute, 4 * time.Minute, gpuhealthv1alpha1.SourceKmsg, gpuhealthv1alpha1.ComponentGPU},
		{"gpu-1", "13", gpuhealthv1alpha1.CheckXID, gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.EventResolved, gpuhealthv1alpha1.VerdictObserve, 1, 30 * time.Hour, 30 * time.Hour, gpuhealthv1alpha1.SourceKmsg, gpuhealthv1alpha1.ComponentGPU},
		{"gpu-4", "DOWN", gpuhealthv1alpha1.CheckIMEXDomain, gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.EventActive, gpuhealthv1alpha1.VerdictQuarantine, 1, 2 * time.Minute, time.Minute, gpuhealthv1alpha1.SourceIMEX, gpuhealthv1alpha1.ComponentNode},
	} {
		spec := gpuhealthv1alpha1.NodeHealthEventSpec{NodeName: f.node, Source: f.source, Check: f.check, Code: f.code, Severity: f.sev,
			Component: gpuhealthv1alpha1.Component{Kind: f.kind}, Message: string(f.check) + " " + f.code + " reported"}
		if f.kind == gpuhealthv1alpha1.ComponentGPU {
			spec.Component.ID = "GPU-3"
		}
		ev := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec}
		if err := mk(ev); err != nil {
			return err
		}
		ev.Status = gpuhealthv1alpha1.NodeHealthEventStatus{Count: f.count, FirstSeen: agoP(f.first), LastSeen: agoP(f.last), Phase: f.phase,
			Classification: &gpuhealthv1alpha1.Classification{Verdict: f.verdict, Rule: "default", Policy: "default"}}
		if f.phase == gpuhealthv1alpha1.EventResolved {
			ev.Status.Resolved, ev.Status.ResolvedAt = true, agoP(29*time.Hour)
		}
		if err := status(ev); err != nil {
			return err
		}
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: defaultOperatorNamespace}}
	if err := mk(ns); err != nil {
		return err
	}
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "gpuhealth-reset-gpu-1-1-abcde", Namespace: defaultOperatorNamespace,
			Labels: map[string]string{job.NodeLabel: "gpu-1", job.KindLabel: string(job.ResetGPU), job.AttemptLabel: "1"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "reset", Image: "busybox"}}}}},
	}
	if err := mk(j); err != nil {
		return err
	}
	// No Job controller runs here: the fixture says the Job's pod runs.
	j.Status = batchv1.JobStatus{StartTime: agoP(2 * time.Minute), Active: 1}
	if err := status(j); err != nil {
		return err
	}
	e := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "gpu-1.quarantined", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "gpu-1", APIVersion: "v1"},
		Type:           corev1.EventTypeWarning, Reason: "Quarantined", Message: "XID 79 (Fatal) on GPU-3: cordoned and tainted",
		Source: corev1.EventSource{Component: "gpuhealth-operator"}, Count: 1,
		FirstTimestamp: ago(5 * time.Minute), LastTimestamp: ago(5 * time.Minute),
	}
	return mk(e)
}

// inventory creates node's NodeInventory: eight GPUs of product (the
// node's label) on driver; none when driver is empty.
func inventory(ctx context.Context, c client.Client, node, product, driver string) error {
	if driver == "" {
		return nil
	}
	spec := gpuhealthv1alpha1.NodeInventorySpec{NodeName: node, ObservedAt: ago(time.Minute),
		Driver: gpuhealthv1alpha1.DriverInventory{Version: driver, CUDAVersion: "12.8"}, GPUCount: ptr.To(int32(8))}
	for i := range 8 {
		spec.GPUs = append(spec.GPUs, gpuhealthv1alpha1.GPUInventory{Index: int32(i), Product: strings.ReplaceAll(product, "-", " "), VBIOS: "96.00.74.00.01", ECC: "Enabled", MIG: "Disabled"})
	}
	spec.PCI.GPUs = 8
	return c.Create(ctx, &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: spec})
}

func TestCompletion(t *testing.T) {
	g := NewWithT(t)
	out, errOut, code := plugin(t, "__complete", "story", "")
	g.Expect(code).To(Equal(0), errOut)
	g.Expect(strings.Split(out, "\n")).To(ContainElements("gpu-0", "gpu-1", ":4"))
	out, _, _ = plugin(t, "__complete", "reset-breaker", "")
	g.Expect(strings.Split(out, "\n")).To(ContainElements("default", ":4"))
	out, _, code = plugin(t, "completion", "bash")
	g.Expect(code).To(Equal(0))
	g.Expect(out).To(ContainSubstring("bash completion V2 for kubectl-gpuhealth"))
}
