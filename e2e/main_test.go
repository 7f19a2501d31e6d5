//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// env is the one installation every case runs against, in order.
var env *framework.Env

// e2ePolicy shortens the default policy's durations so that a whole cycle
// takes seconds: the sample's soak window, backoff and timeouts are meant for
// real machines. The circuit breaker is off: the suite quarantines nodes far
// more often than any real cluster should (its envtest suite covers it).
// kwok runs no container, so nothing prints a report: the suites are
// exit-code steps (kwok's stages finish Job pods, failing those labelled
// gpuhealth.dev/e2e-fail), and new nodes are certified only where a case
// says so; the real-node tier runs the parsers on real output.
// The fake nodes' cliques come from their labels, and the fabric cases
// fault one node of a clique: one report taints it here.
// Everything else is the sample as shipped.
const e2ePolicy = `{"spec":{
  "certification":{"newNodes":false,"backoff":"2s","steps":` + kwokStep + `},
  "recertification":{"soakWindow":"1s","backoff":"2s","maxAttempts":2,"steps":` + kwokStep + `},
  "remediation":{"diagnostics":null,"rebootNode":{"timeout":"2m"},"resetGPU":{"timeout":"2m"}},
  "circuitBreaker":{"enabled":false},
  "computeDomain":{"singleReportTaintsClique":true},
  "drain":{"timeout":"5m"},
  "devices":{"reset":{"image":"registry.invalid/reset:kwok","privileged":false},"job":{"image":"registry.invalid/recertify:kwok"},"timeout":"2m"}
}}`

// kwokStep is a one-step suite judged by its exit code.
const kwokStep = `[{"name":"recertify","job":{"image":"registry.invalid/recertify:kwok"},"timeout":"2m","parser":{"type":"exit-code"}}]`

// genericWorkload turns on the core gang API where 1.37 needs it: the
// GenericWorkload gate on apiserver, scheduler and controller-manager,
// and the beta API group on the apiserver.
var genericWorkload = []framework.ComponentArg{
	{Component: "kube-apiserver", Key: "feature-gates", Value: "GenericWorkload=true"},
	{Component: "kube-apiserver", Key: "runtime-config", Value: "scheduling.k8s.io/v1beta1=true"},
	{Component: "kube-scheduler", Key: "feature-gates", Value: "GenericWorkload=true"},
	{Component: "kube-controller-manager", Key: "feature-gates", Value: "GenericWorkload=true"},
}

// eventRetention is the operator's --event-retention in this suite.
const eventRetention = 20 * time.Second

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := filepath.Abs("..")
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "gpuhealth-e2e-")
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[e2e %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	env, err = framework.Setup(ctx, framework.Options{
		Prefix: "gpuhealth-e2e", Root: root, Dir: dir, Nodes: 5, PolicyPatch: e2ePolicy, Log: logf,
		// Finished findings go after 20 s instead of a week, so the suite sees the garbage collector work.
		// The ComputeDomain cases switch NVIDIA's driver shapes (CRDs) within
		// the run; the operator notices within a second instead of 30.
		// The hand-off case's template kind, allowed as the chart allows
		// what operator.handOff.rules grant (the case sets those rules).
		OperatorArgs: []string{"--event-retention=" + eventRetention.String(), "--compute-domain-discovery-interval=1s",
			"--handoff-resources=repairrequests.repair.e2e.gpuhealth.dev"},
		// Kubernetes' gang API (scheduling.k8s.io/v1beta1 PodGroup, pods'
		// spec.schedulingGroup) is beta and off by default at 1.37.
		ComponentArgs: genericWorkload,
	})
	code := 1
	var metrics *framework.MetricsRecorder
	if err != nil {
		logf("setting up: %v", err)
	} else {
		SetDefaultEventuallyTimeout(2 * time.Minute)
		SetDefaultEventuallyPollingInterval(250 * time.Millisecond)
		// The operator's gpuhealth_ metrics for the whole run, for the
		// dashboard picture (make dashboard-png).
		if metrics, err = framework.RecordMetrics(env.Operator.Metrics, filepath.Join(dir, "operator-metrics.txt"), 2*time.Second); err != nil {
			logf("recording the operator's metrics: %v", err)
		}
		code = m.Run()
	}
	if metrics != nil {
		saveMetrics(metrics, logf)
	}
	keep := code != 0 || os.Getenv("GPUHEALTH_E2E_KEEP") != ""
	if err := env.Teardown(ctx, keep); err != nil {
		logf("tearing down: %v", err)
	}
	if keep {
		logf("logs of every component, the objects and each node's scenario are in %s", dir)
	} else {
		_ = os.RemoveAll(dir)
	}
	return code
}

// saveMetrics stops the recording of the operator's metrics and copies it
// to $GPUHEALTH_E2E_METRICS, when set (make e2e sets it), which outlives
// the run's folder.
func saveMetrics(r *framework.MetricsRecorder, logf func(string, ...any)) {
	if err := r.Stop(); err != nil {
		logf("recording the operator's metrics: %v", err)
	}
	logf("the operator's metrics are recorded in %s", r.Path)
	if path := os.Getenv("GPUHEALTH_E2E_METRICS"); path != "" {
		if err := r.CopyTo(path); err != nil {
			logf("copying the operator's metrics: %v", err)
			return
		}
		logf("and copied to %s (make dashboard-png draws them)", path)
	}
}
