// Command gpuhealth-operator runs gpuhealth's controllers: it judges
// NodeHealthEvents and drives every managed node through quarantine, drain,
// recertification and back, leader-elected.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/cachetrim"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/controllers/eventgc"
	"github.com/gpuhealth/gpuhealth/controllers/index"
	"github.com/gpuhealth/gpuhealth/controllers/nodefindings"
	"github.com/gpuhealth/gpuhealth/controllers/nodehealth"
	"github.com/gpuhealth/gpuhealth/controllers/policy"
	"github.com/gpuhealth/gpuhealth/internal/eventnote"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/handoff"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// Leader election: the Lease, and the core Events it records on the Lease
// when a replica takes or gives up the lead.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=gpuhealth-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create,namespace=gpuhealth-system
// The metrics endpoint's authentication and authorization (metricsOptions).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	var (
		memLimitRatio  float64
		gcWithoutLimit int
		s              serving
		o              options
	)
	flag.StringVar(&s.metricsAddr, "metrics-bind-address", ":8080", "Address the Prometheus metrics endpoint binds to; \"0\" turns it off.")
	flag.BoolVar(&s.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS to scrapers whose bearer token the apiserver authenticates (TokenReview) and authorizes for GET /metrics (SubjectAccessReview); false serves them over plain HTTP to anyone who can reach the port.")
	flag.StringVar(&s.metricsCertDir, "metrics-cert-dir", "", "Directory with the metrics endpoint's tls.crt and tls.key (reloaded when they change); empty, or without them, the endpoint serves a self-signed certificate made at start.")
	flag.StringVar(&s.probeAddr, "health-probe-bind-address", ":8081", "Address the /healthz and /readyz probes bind to.")
	flag.StringVar(&s.pprofAddr, "pprof-bind-address", "0", "Address Go's pprof endpoints bind to, for profiling; \"0\" (the default) turns them off.")
	flag.BoolVar(&s.leaderElect, "leader-elect", true, "Elect a leader so that only one replica acts at a time.")
	flag.StringVar(&s.leaderElectionID, "leader-election-id", "gpuhealth-operator.gpuhealth.dev", "Name of the leader election Lease.")
	flag.StringVar(&o.namespace, "namespace", envOr("POD_NAMESPACE", "gpuhealth-system"), "Namespace of the leader election Lease and of recertification and remediation Jobs.")
	flag.StringVar(&o.driverNamespace, "compute-domain-driver-namespace", computedomain.DefaultDriverNamespace, "Namespace of NVIDIA's DRA driver, where the ComputeDomain daemon pods and ComputeDomainCliques are; a pod labelled with a domain, or a clique, anywhere else ties no node to a domain, and the operator caches no pod outside it.")
	flag.IntVar(&o.workers, "workers", 16, "Nodes reconciled in parallel.")
	flag.DurationVar(&o.stormQuiet, "storm-quiet", 300*time.Millisecond, "In a storm of quarantines, write up fenced nodes (transition, node condition, Event) only once no node has been fenced for this long; 0 writes each up right after its fence.")
	flag.DurationVar(&o.stormHoldMax, "storm-hold-max", 10*time.Second, "The longest a fenced node's write-up waits for a storm to pass.")
	flag.DurationVar(&o.eventRetention, "event-retention", 7*24*time.Hour, "How long a finished NodeHealthEvent (Resolved, Superseded or Ignored) is kept; 0 keeps them (only --max-events-per-node bounds them). Active findings are never deleted.")
	flag.IntVar(&o.maxEventsPerNode, "max-events-per-node", 100, "The most NodeHealthEvents kept per node; beyond it the oldest finished ones are deleted, and when a node's unfinished ones alone are more, the least recently seen judged Observe (never one judged Quarantine or not yet judged); 0 means no cap.")
	flag.Float64Var(&o.qps, "kube-api-qps", 20, "Requests per second to the apiserver, sustained (client-side rate limit).")
	flag.IntVar(&o.burst, "kube-api-burst", 30, "Requests to the apiserver allowed in a burst above --kube-api-qps.")
	flag.DurationVar(&o.cdDiscovery, "compute-domain-discovery-interval", computedomain.DefaultPollInterval, "How often to ask the apiserver whether NVIDIA's ComputeDomain CRDs (and which of their kinds) are served; a driver installed, upgraded or removed later is noticed within this time.")
	flag.StringVar(&o.handOffResources, "handoff-resources", "", "Comma-separated resources a Template hand-off may create, each resource.group (\"repairrequests.repair.example.com\"); the chart renders it from operator.handOff.rules. Kinds of the core, batch, apps, rbac.authorization.k8s.io and gpuhealth.dev groups, and objects in --namespace, are refused whatever it says. Empty: none.")
	flag.StringVar(&o.jobs.serviceAccount, "job-service-account", job.DefaultServiceAccount, "Service account, in --namespace, of the policy's Jobs whose template names none; its token is not mounted. The chart's has no RBAC.")
	flag.StringVar(&o.jobs.allowedServiceAccounts, "job-allowed-service-accounts", "", "Comma-separated service accounts a policy's Job template may name besides --job-service-account (never gpuhealth-operator or gpuhealth-monitor); empty: none.")
	flag.StringVar(&o.jobs.privilegedSteps, "job-privileged-steps", string(job.ResetGPU)+","+string(job.RebootNode)+","+string(job.Diagnostics)+","+string(job.DeviceReset), "Comma-separated kinds of Job whose template may be privileged or use the host's PID namespace: cert, recert, reset, reboot, clique, diag, devreset, devcert.")
	flag.StringVar(&o.jobs.imagePrefixes, "job-image-prefixes", "", "Comma-separated prefixes, each ending in '/', ':' or '@', one of which every image of a policy's Jobs must start with; empty: none, so a policy with any Job is not acted on.")
	flag.Float64Var(&memLimitRatio, "memory-limit-ratio", 0.9, "The Go runtime's soft memory limit as a share of the container's memory limit ("+memoryLimitEnv+", bytes, which the chart passes from limits.memory; without it the memory limit of the process's cgroup): near it the garbage collector runs more often rather than let the process reach the OOM kill; 0 turns it off, and GOMEMLIMIT, when set, wins.")
	flag.IntVar(&gcWithoutLimit, "gc-percent-without-limit", 50, "The garbage collector's GOGC when the process has no memory limit (none passed, none in its cgroup, no GOMEMLIMIT): the heap may grow to 1+GOGC/100 times what is live; GOGC in the environment wins, and 0 leaves the runtime's 100.")
	opts := zap.Options{Development: false, TimeEncoder: zapcore.ISO8601TimeEncoder}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	memLimit, err := softMemoryLimit(os.Getenv, memLimitRatio, memlimit.FromCgroup)
	if err != nil {
		return err
	}
	if memLimit.bytes > 0 {
		debug.SetMemoryLimit(memLimit.bytes)
		ctrl.Log.WithName("setup").Info("Soft memory limit set", "bytes", memLimit.bytes, "ratio", memLimitRatio, "from", memLimit.from)
	}
	if pct := gcPercent(os.Getenv, memLimit, gcWithoutLimit); pct > 0 {
		debug.SetGCPercent(pct)
		ctrl.Log.WithName("setup").Info("No memory limit: GOGC set", "percent", pct, "why", memLimit.from)
	}
	if o.cdDiscovery <= 0 {
		return fmt.Errorf("--compute-domain-discovery-interval must be positive, got %s", o.cdDiscovery)
	}
	if o.driverNamespace == "" {
		return errors.New("--compute-domain-driver-namespace must not be empty")
	}
	if o.qps <= 0 || o.burst <= 0 {
		return fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive, got %g and %d", o.qps, o.burst)
	}
	if o.jobRules, err = o.jobs.rules(); err != nil {
		return err
	}

	scheme, err := newScheme()
	if err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	mgr, err := ctrl.NewManager(cfg, managerOptions(scheme, s, o))
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := setup(ctx, mgr, o); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "namespace", o.namespace, "leaderElect", s.leaderElect, "metricsSecure", s.metricsSecure)
	return mgr.Start(ctx)
}

// newScheme holds the Kubernetes kinds and gpuhealth's.
func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := gpuhealthv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// serving are the flags of the manager's endpoints and leader election.
type serving struct {
	// metricsAddr is the metrics endpoint's address; "0" turns it off.
	metricsAddr string
	// metricsSecure serves metrics over HTTPS behind the apiserver's
	// authentication and authorization.
	metricsSecure bool
	// metricsCertDir holds tls.crt and tls.key; empty means a self-signed
	// certificate.
	metricsCertDir   string
	probeAddr        string
	pprofAddr        string
	leaderElect      bool
	leaderElectionID string
}

// managerOptions are the manager's options for the flags.
func managerOptions(scheme *runtime.Scheme, s serving, o options) ctrl.Options {
	return ctrl.Options{
		Scheme: scheme,
		// Every write names the operator, whatever the binary is called:
		// the reconciler tells its own writes of a Node from a human's by it.
		Client:                        client.Options{FieldOwner: nodehealth.FieldManager},
		Metrics:                       metricsOptions(s),
		HealthProbeBindAddress:        s.probeAddr,
		PprofBindAddress:              s.pprofAddr,
		LeaderElection:                s.leaderElect,
		LeaderElectionID:              s.leaderElectionID,
		LeaderElectionNamespace:       o.namespace,
		LeaderElectionReleaseOnCancel: true,
		// Jobs are watched only in the operator's namespace (a namespaced
		// Role, not cluster-wide access), Pods only in the DRA driver's;
		// every object is cached without managedFields, and Pods and Nodes
		// with only what is read of them.
		Cache: cachetrim.CacheOptions(o.namespace, o.driverNamespace),
	}
}

// metricsOptions serve the metrics, by default over HTTPS to scrapers the
// apiserver vouches for: the filter sends each new bearer token to a
// TokenReview and asks a SubjectAccessReview whether its user may GET
// /metrics (a nonResourceURLs rule, the chart's gpuhealth-metrics-reader
// ClusterRole), and caches the answers (a minute for tokens, five for
// allowed reviews), so a scrape every 30 seconds costs the apiserver about
// one review a minute.
// https://github.com/kubernetes-sigs/controller-runtime/blob/v0.25.2/pkg/metrics/filters/filters.go
func metricsOptions(s serving) metricsserver.Options {
	if !s.metricsSecure {
		return metricsserver.Options{BindAddress: s.metricsAddr}
	}
	return metricsserver.Options{
		BindAddress:    s.metricsAddr,
		SecureServing:  true,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
		CertDir:        s.metricsCertDir,
		// HTTP/1.1 only: HTTP/2's stream reset and stream cancellation
		// floods (CVE-2023-44487, CVE-2023-39325) reach the handler before
		// authentication, and a scraper gains nothing from HTTP/2.
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
}

// options are the flags the controllers take.
type options struct {
	namespace string
	// driverNamespace is the DRA driver's namespace, where the
	// ComputeDomain daemon pods run.
	driverNamespace  string
	workers          int
	stormQuiet       time.Duration
	stormHoldMax     time.Duration
	eventRetention   time.Duration
	maxEventsPerNode int
	// cdDiscovery is how often the ComputeDomain view asks whether
	// NVIDIA's CRDs are served.
	cdDiscovery time.Duration
	// qps and burst limit the client's requests to the apiserver.
	qps   float64
	burst int
	// handOffResources is --handoff-resources, unparsed.
	handOffResources string
	// jobs are the --job-* flags; jobRules the rules they make.
	jobs     jobRuleFlags
	jobRules job.Rules
}

// setup is the composition root: it builds the clock, recorder and drainer
// and hands them to the controllers.
func setup(ctx context.Context, mgr ctrl.Manager, o options) error {
	clk := clock.RealClock{}
	disc, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("creating the discovery client: %w", err)
	}
	// Suite steps' output is read from their pods' logs, which only the
	// clientset's pods/log subresource serves.
	clientset, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("creating the clientset: %w", err)
	}
	// The ComputeDomain view waits for NVIDIA's CRDs and watches them once
	// they are served; without them it costs one discovery GET per interval.
	view := computedomain.NewView(mgr.GetCache(), disc, clk, o.driverNamespace)
	view.PollInterval = o.cdDiscovery
	if err := mgr.Add(view); err != nil {
		return fmt.Errorf("adding the ComputeDomain view: %w", err)
	}
	if err := index.Register(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	// Every note cut to what the apiserver accepts: a refused Event is lost.
	recorder := eventnote.Bounded(mgr.GetEventRecorder(nodehealth.FieldManager))
	// The drain lists and watches a node's pods on the apiserver: workload
	// pods are not cached (controllers/cachetrim).
	pods, err := client.NewWithWatch(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), HTTPClient: mgr.GetHTTPClient()})
	if err != nil {
		return fmt.Errorf("creating the pods client: %w", err)
	}
	// The hand-off acts as its own service account, which holds only the
	// install's hand-off rules, never as the operator.
	handOffResources, err := handoff.ParseResources(o.handOffResources)
	if err != nil {
		return fmt.Errorf("--handoff-resources: %w", err)
	}
	handOff, err := handoff.NewClient(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()}, o.namespace, handoff.ServiceAccount)
	if err != nil {
		return err
	}
	// One breaker: the nodehealth reconciler asks it, the policy status
	// controller mirrors it.
	brk := breaker.New()
	r := &nodehealth.Reconciler{
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		HandOff:                 client.WithFieldOwner(handOff, nodehealth.FieldManager),
		HandOffResources:        handOffResources,
		Clock:                   clk,
		Recorder:                recorder,
		Drainer:                 drain.New(mgr.GetClient(), pods, clk, o.namespace),
		Breaker:                 brk,
		Namespace:               o.namespace,
		DriverNamespace:         o.driverNamespace,
		JobRules:                o.jobRules,
		Outputs:                 job.LogReader{Clientset: clientset},
		Waits:                   job.LogReader{Clientset: clientset},
		ComputeDomains:          view,
		MaxConcurrentReconciles: o.workers,
		StormQuiet:              o.stormQuiet,
		StormHoldMax:            o.stormHoldMax,
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the nodehealth controller: %w", err)
	}
	if err := (&computedomain.FabricReconciler{Client: mgr.GetClient(), Recorder: recorder, Clock: clk, Cliques: view,
		Namespace: o.namespace, Outputs: job.LogReader{Clientset: clientset}, JobRules: o.jobRules}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the fabric controller: %w", err)
	}
	if err := (&policy.Reconciler{Client: mgr.GetClient(), Cache: mgr.GetCache(), Clock: clk, Recorder: recorder, Breaker: brk, JobRules: o.jobRules}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the policy status controller: %w", err)
	}
	gc := &eventgc.Reconciler{Client: mgr.GetClient(), Clock: clk, Retention: o.eventRetention, MaxPerNode: o.maxEventsPerNode}
	if err := gc.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the event garbage collector: %w", err)
	}
	if err := (&nodefindings.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Clock: clk}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the derived findings controller: %w", err)
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
