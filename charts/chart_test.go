package charts_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/monitors/agent"
)

var update = flag.Bool("update", false, "rewrite the golden renders in testdata/golden")

// env is the control plane the renders are dry-run against.
var env *testenv.Env

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testenv.Main(m, func(e *testenv.Env) error { env = e; return nil }))
}

// helmBin is the helm the Makefile installs (HELM), or ../bin's.
func helmBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		bin = filepath.Join("..", "bin", "helm-v3.22.0")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm not found at %s (run 'make helm', or set HELM): %v", bin, err)
	}
	return bin
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// profiles are the values sets every check runs for.
var profiles = []struct {
	name string
	args []string
}{
	{"monitor-only", nil},
	{"remediation", []string{"-f", "gpuhealth/values-remediation.yaml"}},
	{"everything", []string{"-f", "testdata/values-everything.yaml"}},
}

// render runs helm template for the release gpuhealth in gpuhealth-system.
func render(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, append([]string{"template", "gpuhealth", "gpuhealth", "--namespace", "gpuhealth-system"}, args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, out)
	}
	return decode(t, out)
}

func decode(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decoding the render: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func TestLintStrict(t *testing.T) {
	for _, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			out, err := helm(t, append([]string{"lint", "--strict", "gpuhealth"}, p.args...)...)
			if err != nil {
				t.Fatalf("helm lint --strict: %v\n%s", err, out)
			}
		})
	}
}

// TestGoldenRenders compares each profile's render, CRDs left out (the API
// suites and make verify-generated cover them), with testdata/golden.
// Regenerate them with go test ./charts -run TestGoldenRenders -update.
func TestGoldenRenders(t *testing.T) {
	for _, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", "gpuhealth", "gpuhealth", "--namespace", "gpuhealth-system", "--set", "crds.install=false"}, p.args...)...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			golden := filepath.Join("testdata", "golden", p.name+".yaml")
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if out != string(want) {
				t.Errorf("the render differs from %s; if the change is meant, run go test ./charts -run TestGoldenRenders -update and review the diff", golden)
			}
		})
	}
}

// TestSchemaRefusesBadValues: each testdata/bad file fails helm template
// with the message its first line names.
func TestSchemaRefusesBadValues(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml"))
	if err != nil || len(files) < 10 {
		t.Fatalf("want at least 10 bad values files, found %d (%v)", len(files), err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := strings.Cut(string(b), "\n")
			want, ok := strings.CutPrefix(first, "# want: ")
			if !ok {
				t.Fatalf("%s does not start with '# want: <message>'", f)
			}
			out, err := helm(t, "template", "gpuhealth", "gpuhealth", "-f", f)
			if err == nil {
				t.Fatalf("helm template accepted %s", f)
			}
			if !strings.Contains(out, want) {
				t.Fatalf("helm template's message does not name the problem %q:\n%s", want, out)
			}
		})
	}
}

// TestRendersPassServerSideDryRun applies every object of every profile,
// and of the kustomize install (config/default), to a real apiserver as a
// server-side apply with dry-run and strict field validation. The
// Prometheus Operator's kinds are left out: their CRDs are not installed
// here (config/prometheus's tests check the rules).
func TestRendersPassServerSideDryRun(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	for _, ns := range []string{"gpuhealth-system", "nvidia-dra-driver-gpu", "monitoring"} {
		err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		g.Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
	}
	sets := map[string][]*unstructured.Unstructured{}
	for _, p := range profiles {
		sets[p.name] = render(t, p.args...)
	}
	kustomize, err := os.ReadFile(filepath.Join("..", "config", "default", "gpuhealth.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	sets["config/default"] = decode(t, string(kustomize))
	for name, objs := range sets {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			n := 0
			for _, o := range objs {
				if o.GroupVersionKind().Group == "monitoring.coreos.com" {
					continue
				}
				// Server-side apply refuses fields the schema does not declare.
				err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.DryRunAll, client.ForceOwnership,
					client.FieldOwner("chart-test"))
				g.Expect(err).NotTo(HaveOccurred(), "%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
				n++
			}
			g.Expect(n).To(BeNumerically(">=", 15), "the render has the product's objects")
		})
	}
	// A dry run writes nothing.
	g.Expect(apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: "gpuhealth-system", Name: "gpuhealth-operator"}, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment"}}))).To(BeTrue())
}

// TestDefaultPolicyIsTheSample: the policy the chart installs is
// config/samples' with dryRun as the profile says.
func TestDefaultPolicyIsTheSample(t *testing.T) {
	g := NewWithT(t)
	b, err := os.ReadFile(filepath.Join("..", "config", "samples", "gpuhealth_v1alpha1_remediationpolicy.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var sample map[string]any
	g.Expect(yaml.Unmarshal(b, &sample)).To(Succeed())
	want := sample["spec"].(map[string]any)
	for _, p := range profiles[:2] {
		got := find(render(t, p.args...), "RemediationPolicy", "default")
		g.Expect(got).NotTo(BeNil())
		spec := got.Object["spec"].(map[string]any)
		g.Expect(spec["dryRun"]).To(Equal(p.name == "monitor-only"), "%s: dryRun", p.name)
		delete(spec, "dryRun")
		w := maps.Clone(want)
		delete(w, "dryRun")
		g.Expect(spec).To(Equal(w), "%s: the chart's policy.spec drifted from the sample", p.name)
	}
}

// TestMonitorConfigurationParses: the agent's configuration the chart
// renders is one the agent accepts (its strict parser), and names the kmsg
// source exactly when the agent may read the kernel log.
func TestMonitorConfigurationParses(t *testing.T) {
	cases := append(slices.Clone(profiles), struct {
		name string
		args []string
	}{"kmsg-off", []string{"--set", "monitor.kmsg.enabled=false"}})
	for _, p := range cases {
		t.Run(p.name, func(t *testing.T) {
			g := NewWithT(t)
			objs := render(t, p.args...)
			cm := find(objs, "ConfigMap", "gpuhealth-monitor")
			g.Expect(cm).NotTo(BeNil())
			data, _, _ := unstructured.NestedString(cm.Object, "data", "monitor.yaml")
			cfg, err := agent.ParseConfig([]byte(data))
			g.Expect(err).NotTo(HaveOccurred(), "rendered:\n%s", data)
			ds := find(objs, "DaemonSet", "gpuhealth-monitor")
			g.Expect(ds).NotTo(BeNil())
			containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
			sc := containers[0].(map[string]any)["securityContext"].(map[string]any)
			kmsg := p.name != "kmsg-off"
			g.Expect(sc["privileged"]).To(Equal(kmsg), "privileged exactly when the kernel log is read")
			g.Expect(slices.Contains(cfg.Sources, "kmsg")).To(Equal(kmsg))
			if p.name != "everything" { // its values name the sources
				g.Expect(cfg.Sources).To(ContainElements("services", "ib"), "the sources that read the host's mounts run by default")
				g.Expect(cfg.IB.SysRoot).To(Equal("/host/sys"))
			}
			g.Expect(fmt.Sprint(containers[0].(map[string]any)["volumeMounts"])).To(map[bool]OmegaMatcher{true: ContainSubstring("/dev/kmsg"), false: Not(ContainSubstring("/dev/kmsg"))}[kmsg])
		})
	}
}

// TestMonitorHostMounts: monitor.driverRoot names the driver root's host
// path or, empty, leaves its mount out; extraEnv, extraVolumes and
// extraVolumeMounts reach the agent's pod.
func TestMonitorHostMounts(t *testing.T) {
	g := NewWithT(t)
	pod := func(args ...string) (container map[string]any, volumes string) {
		ds := find(render(t, args...), "DaemonSet", "gpuhealth-monitor")
		g.Expect(ds).NotTo(BeNil())
		containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
		vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
		return containers[0].(map[string]any), fmt.Sprint(vols)
	}
	c, vols := pod()
	g.Expect(fmt.Sprint(c["volumeMounts"])).To(ContainSubstring("mountPropagation:HostToContainer"))
	g.Expect(vols).To(ContainSubstring("path:/run/nvidia/driver"))
	_, vols = pod("--set", "monitor.driverRoot=/opt/nvidia/driver")
	g.Expect(vols).To(ContainSubstring("path:/opt/nvidia/driver"))
	c, vols = pod("--set", "monitor.driverRoot=",
		"--set", "monitor.extraEnv[0].name=LD_LIBRARY_PATH", "--set", "monitor.extraEnv[0].value=/nvidia/lib",
		"--set", "monitor.extraVolumes[0].name=lib", "--set", "monitor.extraVolumes[0].hostPath.path=/usr/lib/nvidia",
		"--set", "monitor.extraVolumeMounts[0].name=lib", "--set", "monitor.extraVolumeMounts[0].mountPath=/nvidia/lib")
	g.Expect(fmt.Sprint(c["volumeMounts"])).NotTo(ContainSubstring("driver-root"))
	g.Expect(vols).NotTo(ContainSubstring("driver-root"))
	g.Expect(fmt.Sprint(c["volumeMounts"])).To(ContainSubstring("mountPath:/nvidia/lib"))
	g.Expect(vols).To(ContainSubstring("path:/usr/lib/nvidia"))
	g.Expect(fmt.Sprint(c["env"])).To(ContainSubstring("name:LD_LIBRARY_PATH value:/nvidia/lib"))
	// The host's processes and package database, read-only, always; the
	// host's IMEX configuration only when named.
	c, vols = pod()
	g.Expect(fmt.Sprint(c["volumeMounts"])).To(And(ContainSubstring("mountPath:/host/proc name:host-proc readOnly:true recursiveReadOnly:IfPossible"),
		ContainSubstring("mountPath:/host/var/lib/dpkg name:host-dpkg readOnly:true"),
		ContainSubstring("mountPath:/host/sys/class name:host-sys-class readOnly:true"),
		ContainSubstring("mountPath:/host/sys/bus name:host-sys-bus readOnly:true"),
		ContainSubstring("mountPath:/host/sys/devices name:host-sys-devices readOnly:true")))
	g.Expect(vols).To(And(ContainSubstring("hostPath:map[path:/sys/devices type:Directory] name:host-sys-devices"),
		Not(ContainSubstring("path:/sys type:"))), "never the whole /sys: its submounts (cgroup2, bpffs) are writable through a read-only mount")
	g.Expect(vols).NotTo(ContainSubstring("host-imex-config"))
	c, vols = pod("--set", "monitor.hostIMEXConfig=/etc/nvidia-imex")
	g.Expect(fmt.Sprint(c["volumeMounts"])).To(ContainSubstring("mountPath:/host/etc/nvidia-imex name:host-imex-config readOnly:true"))
	g.Expect(vols).To(ContainSubstring("path:/etc/nvidia-imex type:Directory"))
}

// TestChangedConfigurationRollsTheAgents: the DaemonSet's pod template
// carries a hash of the agent's configuration.
func TestChangedConfigurationRollsTheAgents(t *testing.T) {
	g := NewWithT(t)
	hash := func(args ...string) string {
		ds := find(render(t, args...), "DaemonSet", "gpuhealth-monitor")
		h, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "metadata", "annotations", "gpuhealth.dev/config-hash")
		return h
	}
	base := hash()
	g.Expect(base).NotTo(BeEmpty())
	g.Expect(hash("--set", "monitor.config.publish.qps=5")).NotTo(Equal(base))
	g.Expect(hash("--set", "operator.workers=4")).To(Equal(base))
}

// TestGoodputTargetReachesTheAlert: metrics.prometheusRule.goodputTarget
// replaces the default in GPUHealthGoodputLow's expression, and only there.
func TestGoodputTargetReachesTheAlert(t *testing.T) {
	g := NewWithT(t)
	alert := func(args ...string) map[string]any {
		objs := render(t, append([]string{"--set", "metrics.prometheusRule.enabled=true"}, args...)...)
		rule := find(objs, "PrometheusRule", "gpuhealth")
		g.Expect(rule).NotTo(BeNil())
		groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
		for _, gr := range groups {
			rules, _ := gr.(map[string]any)["rules"].([]any)
			for _, r := range rules {
				if m := r.(map[string]any); m["alert"] == "GPUHealthGoodputLow" {
					return m
				}
			}
		}
		t.Fatal("no GPUHealthGoodputLow in the render")
		return nil
	}
	g.Expect(alert()).To(HaveKeyWithValue("expr", "gpuhealth:goodput:ratio_avg1h < 0.95"))
	g.Expect(alert("--set-json", "metrics.prometheusRule.goodputTarget=0.9")).To(HaveKeyWithValue("expr", "gpuhealth:goodput:ratio_avg1h < 0.9"))
}
