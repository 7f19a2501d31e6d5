package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/controllers/nodehealth"
	"github.com/gpuhealth/gpuhealth/internal/test/apirecord"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	"github.com/gpuhealth/gpuhealth/remediation/member"
)

// The suite runs the operator's composition root (setup) in a manager
// built with managerOptions, as the gpuhealth-operator service account
// with config/rbac applied (the chart ships the same file), against a real
// apiserver with NVIDIA's ComputeDomain CRDs served, and records every
// request it sends.

const (
	namespace  = "gpuhealth-system"
	operatorSA = "gpuhealth-operator"
)

var (
	env *testenv.Env
	// operatorConfig authenticates as the operator's service account.
	operatorConfig *rest.Config
)

func TestMain(m *testing.M) {
	shapes := testenv.DriverShapes()
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		env = e
		ctx := context.Background()
		if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
			return err
		}
		// What the user installs: the service account, the ClusterRole and
		// Role the markers make, and their bindings.
		for _, f := range []string{"service_account.yaml", "role.yaml", "role_binding.yaml", "metrics_reader_role.yaml"} {
			if err := apply(ctx, e.Client, filepath.Join("..", "..", "config", "rbac", f)); err != nil {
				return err
			}
		}
		operatorConfig = rest.CopyConfig(e.Config)
		operatorConfig.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":" + operatorSA}
		return nil
	}, shapes[len(shapes)-1].Dir))
}

// apply creates every object of a manifest file.
func apply(ctx context.Context, c client.Client, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("decoding %s: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := c.Create(ctx, u); err != nil {
			return fmt.Errorf("creating %s %s from %s: %w", u.GetKind(), u.GetName(), path, err)
		}
	}
}

// notReached are granted calls the scenario below does not make, each with
// the code that makes it and the suite that runs that code. Keep it short:
// every entry is a grant this test cannot prove used.
var notReached = map[apirecord.Call]string{
	// A clique certification Job's verdict annotation
	// (controllers/computedomain cliquecert.go, judgeClique), run by
	// controllers/computedomain's clique certification tests.
	{Verb: "patch", Group: "batch", Resource: "jobs"}: "clique certification verdict",
}

// TestOperatorRBACIsWhatItUses runs the operator through a node's whole
// cycle (finding, quarantine, drain, recertification, return), an ignored
// finding's garbage collection, a dead ComputeDomain member's pod, a suite
// step's output and one authenticated scrape of its metrics, and checks
// that the apiserver refused nothing and that the calls it made are exactly
// the calls config/rbac grants (a read verb counts as used when a read
// that reveals as much was: apirecord.Diff).
func TestOperatorRBACIsWhatItUses(t *testing.T) {
	g := NewWithT(t)
	g.SetDefaultEventuallyTimeout(30 * time.Second)
	g.SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := env.Client

	rec := apirecord.New()
	cfg := rec.Wrap(operatorConfig)
	scheme, err := newScheme()
	g.Expect(err).NotTo(HaveOccurred())
	metricsAddr := freeAddr(t)
	opts := managerOptions(scheme,
		serving{metricsAddr: metricsAddr, metricsSecure: true, probeAddr: "0", pprofAddr: "0", leaderElect: true, leaderElectionID: "gpuhealth-operator.gpuhealth.dev"},
		options{namespace: namespace, driverNamespace: computedomain.DefaultDriverNamespace, workers: 4, eventRetention: time.Nanosecond, maxEventsPerNode: 100, cdDiscovery: time.Second, qps: 100, burst: 100})
	opts.Controller = config.Controller{SkipNameValidation: ptr.To(true)}
	// Quick leader election, so that a renewal falls inside the test.
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = ptr.To(3*time.Second), ptr.To(2*time.Second), ptr.To(500*time.Millisecond)
	mgr, err := ctrl.NewManager(cfg, opts)
	g.Expect(err).NotTo(HaveOccurred())
	// The install's Job rules, as the chart's defaults give them.
	rules := job.Rules{ServiceAccount: job.DefaultServiceAccount, Reserved: reservedServiceAccounts, ImagePrefixes: []string{"nvcr.io/nvidia/"}}
	g.Expect(setup(ctx, mgr, options{namespace: namespace, driverNamespace: computedomain.DefaultDriverNamespace, workers: 4, eventRetention: time.Nanosecond,
		maxEventsPerNode: 100, cdDiscovery: time.Second, jobRules: rules})).To(Succeed())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			g.Expect(<-done).To(Succeed())
		}
	}
	defer stop()

	// It leads, and renews the Lease.
	lease := &coordinationv1.Lease{}
	g.Eventually(func(g Gomega) {
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "gpuhealth-operator.gpuhealth.dev"}, lease)).To(Succeed())
		g.Expect(lease.Spec.RenewTime).NotTo(BeNil())
		g.Expect(lease.Spec.RenewTime.Sub(lease.Spec.AcquireTime.Time)).To(BeNumerically(">", 0))
	}).Should(Succeed())

	// A policy that quarantines, drains, recertifies with one Job, and
	// ignores XID 45.
	const label = "rbac-test"
	policy := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: label},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": label}},
			Rules: []gpuhealthv1alpha1.Rule{{
				Name: "ignore-preemptive-cleanup", Verdict: gpuhealthv1alpha1.VerdictIgnore,
				Match: gpuhealthv1alpha1.RuleMatch{Checks: []gpuhealthv1alpha1.Check{gpuhealthv1alpha1.CheckXID}, Codes: []string{"45"}},
			}},
		},
	}
	// Namespaces picked by label: the drain reads them.
	policy.Spec.Drain.Namespaces = []gpuhealthv1alpha1.NamespaceDrain{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gpuhealth.dev/drain": "wait"}},
		Mode:              gpuhealthv1alpha1.DrainWaitForCompletion,
	}}
	policy.Spec.Recertification.Job = &gpuhealthv1alpha1.JobTemplate{Image: "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04", Command: []string{"dcgmi", "diag", "-r", "2"}}
	policy.Spec.Recertification.SoakWindow = ptr.To(gpuhealthv1alpha1.Duration("0s"))
	// A Node condition it observes: the operator writes that finding.
	policy.Spec.Conditions = []gpuhealthv1alpha1.NodeConditionRule{{Type: "KernelDeadlock", Verdict: gpuhealthv1alpha1.VerdictObserve}}
	g.Expect(admin.Create(ctx, policy)).To(Succeed())
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: label + "-node", Labels: map[string]string{"test": label, "nvidia.com/gpu.present": "true"}}}
	g.Expect(admin.Create(ctx, node)).To(Succeed())
	node.Status.Conditions = []corev1.NodeCondition{{Type: "KernelDeadlock", Status: corev1.ConditionTrue, Reason: "DockerHung"}}
	g.Expect(admin.Status().Update(ctx, node)).To(Succeed())
	g.Eventually(func(g Gomega) {
		ev := &gpuhealthv1alpha1.NodeHealthEvent{}
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: gpuhealthv1alpha1.EventName(node.Name, gpuhealthv1alpha1.SourceNodeCondition, gpuhealthv1alpha1.CheckNodeCondition, "", "KernelDeadlock")}, ev)).To(Succeed())
		g.Expect(ev.Status.Count).To(Equal(int64(1)))
	}).Should(Succeed())
	// Cleared, it is resolved (another status patch), then collected.
	g.Expect(admin.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType,
		[]byte(`{"status":{"conditions":[{"type":"KernelDeadlock","status":"False"}]}}`)))).To(Succeed())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: label + "-trainer", Namespace: "default"},
		Spec:       corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "train", Image: "trainer"}}},
	}
	g.Expect(admin.Create(ctx, pod)).To(Succeed())
	finding := func(code string) {
		spec := gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: node.Name, Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID, Code: code,
			Severity:  gpuhealthv1alpha1.SeverityFatal,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-0000"}, Message: "test finding",
		}
		g.Expect(admin.Create(ctx, &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec})).To(Succeed())
	}

	// An ignored finding is judged (status patch) and, its retention over,
	// deleted.
	finding("45")
	g.Eventually(func() int {
		list := &gpuhealthv1alpha1.NodeHealthEventList{}
		g.Expect(admin.List(ctx, list)).To(Succeed())
		return len(list.Items)
	}).Should(BeZero(), "the ignored finding is collected")

	// A fatal one: quarantine, drain (the eviction; envtest has no kubelet,
	// the test removes the evicted pod), recertification (the test plays
	// the Job controller) and return.
	finding("79")
	var recert *batchv1.Job
	g.Eventually(func(g Gomega) {
		p := &corev1.Pod{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(pod), p); err == nil && p.DeletionTimestamp != nil {
			g.Expect(client.IgnoreNotFound(admin.Delete(ctx, p, client.GracePeriodSeconds(0)))).To(Succeed())
		}
		jobs := &batchv1.JobList{}
		g.Expect(admin.List(ctx, jobs, client.InNamespace(namespace), client.MatchingLabels{job.NodeLabel: node.Name})).To(Succeed())
		g.Expect(jobs.Items).To(HaveLen(1), "the recertification Job")
		recert = &jobs.Items[0]
	}).Should(Succeed())
	now := metav1.Now()
	recert.Status.StartTime, recert.Status.CompletionTime, recert.Status.Succeeded = &now, &now, 1
	recert.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
	}
	g.Expect(admin.Status().Update(ctx, recert)).To(Succeed())
	g.Eventually(func(g Gomega) {
		nh := &gpuhealthv1alpha1.NodeHealth{}
		g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(node), nh)).To(Succeed())
		g.Expect(nh.Status.Phase).To(Equal(gpuhealthv1alpha1.PhaseHealthy))
		n := &corev1.Node{}
		g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(node), n)).To(Succeed())
		g.Expect(n.Spec.Unschedulable).To(BeFalse(), "released")
	}).Should(Succeed())

	// The product's calls the cycle above does not reach, made as the
	// operator makes them.
	operator, err := client.New(cfg, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())
	clientset, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	// A dead ComputeDomain member's stale daemon pod (the node is not Ready).
	daemon := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: label + "-daemon", Namespace: "default"},
		Spec:       corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "daemon", Image: "daemon"}}},
	}
	g.Expect(admin.Create(ctx, daemon)).To(Succeed())
	g.Expect(member.DeleteStalePod(ctx, operator, node, daemon)).To(Succeed())
	// A suite step's output: the log of the Job's pod (envtest has no
	// kubelet to serve it; the request is what counts).
	stepPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: label + "-step", Namespace: namespace, Labels: map[string]string{batchv1.JobNameLabel: recert.Name}},
		Spec:       corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "step", Image: "dcgm"}}},
	}
	g.Expect(admin.Create(ctx, stepPod)).To(Succeed())
	stepPod.Status.Phase = corev1.PodSucceeded
	g.Expect(admin.Status().Update(ctx, stepPod)).To(Succeed())
	_, _, _ = job.LogReader{Clientset: clientset}.Output(ctx, namespace, recert.Name)
	// An unfinished Job of a workflow that ended.
	unfinished := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: label + "-reset", Namespace: namespace,
			Labels: map[string]string{job.NodeLabel: node.Name, job.KindLabel: string(job.ResetGPU)}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "reset", Image: "cuda"}},
		}}},
	}
	g.Expect(admin.Create(ctx, unfinished)).To(Succeed())
	g.Expect(job.DeleteUnfinished(ctx, operator, namespace, node.Name)).To(ConsistOf(unfinished.Name))
	// One GPU out of service alone: its slice read, its rule made, raised
	// to NoExecute, listed and deleted, a holder's claim read, and the
	// claim template of its test made and, on return, deleted.
	slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: label + "-gpus"},
		Spec: resourcev1.ResourceSliceSpec{Driver: devicetaint.DefaultDriver, NodeName: ptr.To(node.Name),
			Pool:    resourcev1.ResourcePool{Name: node.Name, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0", Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": {StringValue: ptr.To("GPU-0000")}}}}}}
	g.Expect(admin.Create(ctx, slice)).To(Succeed())
	dev, err := devicetaint.Find(ctx, operator, devicetaint.DefaultDriver, node.Name, "GPU-0000")
	g.Expect(err).NotTo(HaveOccurred())
	_, err = devicetaint.Ensure(ctx, operator, devicetaint.Rule(dev, resourcev1.DeviceTaintEffectNoSchedule, "xid-48"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = devicetaint.Ensure(ctx, operator, devicetaint.Rule(dev, resourcev1.DeviceTaintEffectNoExecute, "xid-48"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = devicetaint.Owned(ctx, operator, node.Name)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(devicetaint.Remove(ctx, operator, devicetaint.RuleName(node.Name, dev.Name))).To(Succeed())
	g.Expect(client.IgnoreNotFound(operator.Get(ctx, client.ObjectKey{Namespace: "default", Name: label + "-claim"}, &resourcev1.ResourceClaim{}))).To(Succeed())
	jd := job.Device{Node: node.Name, Name: dev.Name, UUID: dev.UUID, Driver: dev.Driver, Class: devicetaint.DefaultDriver, TaintKey: devicetaint.TaintKey}
	g.Expect(operator.Create(ctx, job.DeviceClaimTemplate(job.DeviceRecertification, jd, namespace, 1, now.Time))).To(Succeed())
	g.Expect(operator.DeleteAllOf(ctx, &resourcev1.ResourceClaimTemplate{}, client.InNamespace(namespace),
		client.MatchingLabels{job.NodeLabel: node.Name, job.DeviceLabel: dev.Name})).To(Succeed())
	// The same Event twice: the second is a series, which the recorder
	// patches onto the first.
	recorder := mgr.GetEventRecorder(nodehealth.FieldManager)
	for range 2 {
		recorder.Eventf(node, nil, corev1.EventTypeNormal, "RBACTest", "Testing", "an Event about %s", node.Name)
	}
	g.Eventually(func() []apirecord.Call { return rec.Calls() }).Should(ContainElement(apirecord.Call{Verb: "patch", Group: "events.k8s.io", Resource: "events"}))

	// One scrape of the metrics, with a token allowed to read them: the
	// endpoint has the token reviewed and the access authorized.
	token := scraperToken(ctx, g, true)
	g.Eventually(func() (int, error) { return scrape(metricsAddr, token) }).Should(Equal(http.StatusOK))

	stop()
	granted := grantedCalls(t, g)
	unused, ungranted := apirecord.Diff(granted, rec.Calls())
	var unexplained []apirecord.Call
	for _, c := range unused {
		if _, ok := notReached[c]; !ok {
			unexplained = append(unexplained, c)
		}
	}
	if f := rec.Forbidden(); len(f) > 0 {
		t.Errorf("the apiserver refused the operator these calls:\n%s", lines(f))
	}
	if len(unexplained) > 0 {
		t.Errorf("config/rbac grants calls the operator never made (drop them from the +kubebuilder:rbac markers):\n%s", lines(unexplained))
	}
	if len(ungranted) > 0 {
		t.Errorf("the operator made calls config/rbac does not grant:\n%s", lines(ungranted))
	}
	for c, why := range notReached {
		if !slices.Contains(unused, c) {
			t.Errorf("%s (%s) is not granted, or is now reached: update notReached", c, why)
		}
	}
}

// lines writes one call a line.
func lines(calls []apirecord.Call) string {
	var b strings.Builder
	for _, c := range calls {
		b.WriteString("  " + c.String() + "\n")
	}
	return b.String()
}

// TestMetricsNeedAnAuthorizedToken: the operator's metrics answer only a
// bearer token the apiserver authenticates and allows to GET /metrics.
func TestMetricsNeedAnAuthorizedToken(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	scheme, err := newScheme()
	g.Expect(err).NotTo(HaveOccurred())
	addr := freeAddr(t)
	opts := managerOptions(scheme, serving{metricsAddr: addr, metricsSecure: true, probeAddr: "0", pprofAddr: "0"}, options{namespace: namespace, driverNamespace: computedomain.DefaultDriverNamespace})
	mgr, err := ctrl.NewManager(operatorConfig, opts)
	g.Expect(err).NotTo(HaveOccurred())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		g.Expect(<-done).To(Succeed())
	}()
	g.Eventually(func() error { _, err := scrape(addr, ""); return err }, 10*time.Second).Should(Succeed(), "it serves HTTPS")
	g.Expect(scrape(addr, "")).To(Equal(http.StatusUnauthorized), "no token")
	// controller-runtime's filter answers a token the TokenReview calls
	// invalid with 500, as for any error the review returns.
	g.Expect(scrape(addr, "not-a-token")).To(BeNumerically(">=", 400), "a token the apiserver does not know")
	g.Expect(scrape(addr, scraperToken(ctx, g, false))).To(Equal(http.StatusForbidden), "a valid token without the metrics reader's grant")
	g.Expect(scrape(addr, scraperToken(ctx, g, true))).To(Equal(http.StatusOK), "a token with it")
	// Plain HTTP is not served.
	resp, err := http.Get("http://" + addr + "/metrics") //nolint:gosec,noctx // a test URL on localhost
	if err == nil {
		_ = resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), "an HTTPS server's answer to plain HTTP")
	}
}

// grantedCalls are the calls config/rbac's ClusterRole and Role grant.
func grantedCalls(t *testing.T, g Gomega) []apirecord.Call {
	t.Helper()
	ctx := context.Background()
	cr := &rbacv1.ClusterRole{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: operatorSA}, cr)).To(Succeed())
	role := &rbacv1.Role{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: operatorSA}, role)).To(Succeed())
	calls, err := apirecord.Grants(append(cr.Rules, role.Rules...))
	g.Expect(err).NotTo(HaveOccurred())
	// A Role rule the ClusterRole already grants is dead weight.
	clusterWide, err := apirecord.Grants(cr.Rules)
	g.Expect(err).NotTo(HaveOccurred())
	namespaced, err := apirecord.Grants(role.Rules)
	g.Expect(err).NotTo(HaveOccurred())
	if onlyRole, _ := apirecord.Diff(namespaced, clusterWide); len(onlyRole) != len(namespaced) {
		both, _ := apirecord.Diff(namespaced, onlyRole)
		t.Errorf("the Role repeats grants of the ClusterRole:\n%s", lines(both))
	}
	return calls
}

// scraperToken returns a token of a service account bound, when reader, to
// config/rbac's gpuhealth-metrics-reader ClusterRole.
func scraperToken(ctx context.Context, g Gomega, reader bool) string {
	name := "scraper"
	if reader {
		name = "scraper-reader"
	}
	c := env.Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	g.Expect(client.IgnoreAlreadyExists(c.Create(ctx, sa))).To(Succeed())
	if reader {
		g.Expect(client.IgnoreAlreadyExists(c.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "test-metrics-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gpuhealth-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}},
		}))).To(Succeed())
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// scrape GETs https://addr/metrics with token (none when empty) and
// returns the status code.
func scrape(addr, token string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil) //nolint:noctx // a test request on localhost
	if err != nil {
		return 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// The endpoint's certificate is self-signed.
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed test server
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// freeAddr returns a localhost address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}
