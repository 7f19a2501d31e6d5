package framework

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// Namespace is where the operator and the monitor DaemonSet live.
const Namespace = "gpuhealth-system"

// Cluster is one kwokctl cluster with the binary runtime.
type Cluster struct {
	// Name is unique per run.
	Name string
	// Root is the repository root (manifests are read from it).
	Root string
	// BinDir holds the control-plane binaries (hack/controlplane.sh).
	BinDir string
	// WorkDir is kwokctl's work directory for this cluster (KWOK_WORKDIR),
	// so nothing lands in ~/.kwok and the user's kubeconfig is untouched.
	WorkDir string
	// Kubeconfig is the cluster's admin kubeconfig.
	Kubeconfig string
	// KubectlBin is the kubectl Kubectl runs (default: kubectl on PATH).
	KubectlBin string
	// NoControllerLeaderElection runs kube-controller-manager and
	// kube-scheduler without leader election: with it, an apiserver outage
	// longer than their renew deadline (10 s) makes them exit for good, as
	// nobody restarts them. Set before Create.
	NoControllerLeaderElection bool
	// DefaultStages starts kwok with its built-in stages (nodes and pods
	// become Ready; nothing else happens to them) instead of the suite's
	// e2e/testdata/kwok-stages.yaml (Jobs that finish, nodes that go down).
	// Set before Create.
	DefaultStages bool
	// ComponentArgs are extra flags for the control-plane components, which
	// Create hands kwokctl as componentsPatches. Set before Create.
	ComponentArgs []ComponentArg
	// StartTimeout bounds kwokctl create: its --timeout, and its --wait for
	// the components to be ready. Zero: 3 minutes, 2 of them to wait.
	StartTimeout time.Duration
	// ContextKubeconfig, when set before Create, is the file kwokctl adds
	// the cluster's context to; Delete removes the context and the file.
	// Empty: Create has kwokctl write WorkDir/kubeconfig-unused.yaml, and
	// Delete gives kwokctl no --kubeconfig. Nothing reads either file:
	// clients use Kubeconfig, the cluster's own.
	ContextKubeconfig string

	// Config, Client and Clientset act as the cluster admin.
	Config    *rest.Config
	Client    client.Client
	Clientset kubernetes.Interface
	Scheme    *runtime.Scheme
}

// ComponentArg is one flag on a control-plane component's command line.
type ComponentArg struct {
	// Component is kwokctl's name for it: etcd, kube-apiserver,
	// kube-controller-manager, kube-scheduler or kwok-controller.
	Component string
	// Key is the flag's name without the dashes; Value is its value.
	Key, Value string
}

// NewCluster names a cluster (prefix plus a random suffix, or exactly
// prefix when exact); Create starts it.
func NewCluster(prefix string, exact bool, root, binDir, workDir string) (*Cluster, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	for _, bin := range []string{"kwokctl", "kwok", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if st, err := os.Stat(filepath.Join(binDir, bin)); err != nil {
			return nil, fmt.Errorf("control-plane binary %s missing in %s (run hack/controlplane.sh): %w", bin, binDir, err)
		} else if st.IsDir() {
			return nil, fmt.Errorf("control-plane binary %s in %s is a directory", bin, binDir)
		}
	}
	name := fmt.Sprintf("%s-%s", prefix, hex.EncodeToString(b[:]))
	if exact {
		name = prefix
	}
	return &Cluster{
		Name: name, Root: root, BinDir: binDir, WorkDir: workDir,
		Kubeconfig: filepath.Join(workDir, "clusters", name, "kubeconfig.yaml"),
	}, nil
}

// kwokctl runs kwokctl for this cluster.
func (c *Cluster) kwokctl(ctx context.Context, args ...string) error {
	args = append(args, "--name", c.Name)
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kwokctl"), args...)
	cmd.Env = append(os.Environ(), "KWOK_WORKDIR="+c.WorkDir)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kwokctl %s: %w\n%s", strings.Join(args, " "), err, tail(out))
	}
	return nil
}

// Create starts the cluster, with the suite's kwok stages unless
// DefaultStages, and connects to it.
func (c *Cluster) Create(ctx context.Context) error {
	b := func(n string) string { return filepath.Join(c.BinDir, n) }
	config, written, err := c.kwokctlConfig()
	if err != nil {
		return err
	}
	if written {
		// kwokctl keeps a copy with the cluster.
		defer func() { _ = os.Remove(config) }()
	}
	wait, timeout := "2m", "3m"
	if c.StartTimeout > 0 {
		wait, timeout = c.StartTimeout.String(), c.StartTimeout.String()
	}
	unlock, err := c.lockPorts(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	kubeconfig := c.ContextKubeconfig
	if kubeconfig == "" {
		kubeconfig = filepath.Join(c.WorkDir, "kubeconfig-unused.yaml")
	}
	err = c.kwokctl(ctx, "create", "cluster",
		"--runtime", "binary",
		"--kubeconfig", kubeconfig,
		"--config", config,
		"--wait", wait, "--timeout", timeout,
		"--etcd-binary", b("etcd"),
		"--kube-apiserver-binary", b("kube-apiserver"),
		"--kube-controller-manager-binary", b("kube-controller-manager"),
		"--kube-scheduler-binary", b("kube-scheduler"),
		"--kwok-controller-binary", b("kwok"))
	if err != nil {
		return err
	}
	return c.connect()
}

// kwokctlConfig returns the kwokctl configuration file Create passes, and
// whether it wrote that file: the suite's stages file as it is, or, with
// DefaultStages, ComponentArgs or NoControllerLeaderElection, a file of
// the cluster's own in the work directory with the flags added as
// componentsPatches (and no stages with DefaultStages: kwok's built-in
// ones apply when the configuration names none).
func (c *Cluster) kwokctlConfig() (path string, written bool, err error) {
	stages := filepath.Join(c.Root, "e2e", "testdata", "kwok-stages.yaml")
	args := slices.Clone(c.ComponentArgs)
	if c.NoControllerLeaderElection {
		args = append(args,
			ComponentArg{Component: "kube-controller-manager", Key: "leader-elect", Value: "false"},
			ComponentArg{Component: "kube-scheduler", Key: "leader-elect", Value: "false"})
	}
	const anchor = "componentsPatches:\n"
	s := "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokctlConfiguration\n" + anchor
	if !c.DefaultStages {
		if len(args) == 0 {
			return stages, false, nil
		}
		b, err := os.ReadFile(stages)
		if err != nil {
			return "", false, err
		}
		if s = string(b); !strings.Contains(s, anchor) {
			return "", false, fmt.Errorf("%s has no componentsPatches to add to", stages)
		}
	}
	s = strings.Replace(s, anchor, anchor+componentsPatches(args), 1)
	if err := os.MkdirAll(c.WorkDir, 0o700); err != nil {
		return "", false, err
	}
	// Named after the cluster: clusters may share a work directory.
	out := filepath.Join(c.WorkDir, c.Name+"-kwokctl.yaml")
	return out, true, os.WriteFile(out, []byte(s), 0o600)
}

// componentsPatches writes args as kwokctl componentsPatches entries: one
// per component, in the order the components first appear.
func componentsPatches(args []ComponentArg) string {
	var order []string
	byComponent := map[string][]ComponentArg{}
	for _, a := range args {
		if _, ok := byComponent[a.Component]; !ok {
			order = append(order, a.Component)
		}
		byComponent[a.Component] = append(byComponent[a.Component], a)
	}
	var b strings.Builder
	for _, component := range order {
		fmt.Fprintf(&b, "- name: %s\n  extraArgs:\n", component)
		for _, a := range byComponent[component] {
			fmt.Fprintf(&b, "  - {key: %s, value: %s}\n", a.Key, strconv.Quote(a.Value))
		}
	}
	return b.String()
}

// Attach connects to a running kwokctl cluster (one hack/realnode.sh
// started): name in kwokctl's work directory workDir.
func Attach(root, binDir, workDir, name string) (*Cluster, error) {
	c, err := NewCluster(name, true, root, binDir, workDir)
	if err != nil {
		return nil, err
	}
	return c, c.connect()
}

func (c *Cluster) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", c.Kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	c.Config = cfg
	c.Scheme = runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(c.Scheme); err != nil {
		return err
	}
	if err := gpuhealthv1alpha1.AddToScheme(c.Scheme); err != nil {
		return err
	}
	if c.Client, err = client.New(cfg, client.Options{Scheme: c.Scheme}); err != nil {
		return err
	}
	c.Clientset, err = kubernetes.NewForConfig(cfg)
	return err
}

// StopAPIServer stops the cluster's kube-apiserver (an outage: etcd, the
// controllers and kwok keep running and reconnect later) and returns a
// function that starts it again with the same command line and waits until
// it is ready. kwokctl's own stop/start restarts every component; kwok's
// controller came back from that without acting on pods any more, so the
// suite stops just the apiserver, as an apiserver outage does.
func (c *Cluster) StopAPIServer(ctx context.Context) (func() error, error) {
	pidFile := filepath.Join(c.WorkDir, "clusters", c.Name, "pids", "kube-apiserver.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return nil, fmt.Errorf("reading the apiserver's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("parsing the apiserver's pid %q: %w", b, err)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, fmt.Errorf("reading the apiserver's command line: %w", err)
	}
	argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return nil, fmt.Errorf("reading the apiserver's working directory: %w", err)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return nil, err
	}
	// Its port is free until it is back: no cluster may start meanwhile.
	unlock, err := c.lockPorts(ctx)
	if err != nil {
		return nil, err
	}
	// SIGKILL: a crash. (A SIGTERM'd apiserver drains its watches for a
	// minute or more before it exits.)
	if err := proc.Signal(syscall.SIGKILL); err != nil {
		unlock()
		return nil, fmt.Errorf("stopping the apiserver: %w", err)
	}
	if err := Poll(ctx, time.Minute, func() (bool, string) {
		return exited(pid), "the apiserver has not exited"
	}); err != nil {
		unlock()
		return nil, err
	}
	return func() error {
		defer unlock()
		log, err := os.OpenFile(filepath.Join(c.LogsDir(), "kube-apiserver.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer func() { _ = log.Close() }()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir, cmd.Stdout, cmd.Stderr = cwd, log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("restarting the apiserver: %w", err)
		}
		// kwokctl stops the cluster by this file.
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
			return err
		}
		go func() { _ = cmd.Wait() }()
		return Poll(ctx, 2*time.Minute, func() (bool, string) {
			_, err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			return err == nil, fmt.Sprint(err)
		})
	}, nil
}

// lockPorts waits for, and takes, this machine's lock on choosing
// control-plane ports (a file beside kwokctl, which hack/realnode.sh takes
// with flock(1) too). kwokctl picks its components' ports by listening and
// closing, walking down from 32766 in every run: two clusters created at
// once pick the same ones, and a cluster created during another's
// apiserver outage can take that apiserver's port. Harnesses side by side
// (the real-node tier beside the soak) therefore create their clusters,
// and stop an apiserver, one at a time. The returned function releases
// the lock; exiting does as well.
func (c *Cluster) lockPorts(ctx context.Context) (func(), error) {
	f, err := os.OpenFile(filepath.Join(c.BinDir, ".ports.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the port lock: %w", err)
	}
	err = Poll(ctx, 5*time.Minute, func() (bool, string) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		return err == nil, fmt.Sprintf("another cluster on this machine holds %s: %v", f.Name(), err)
	})
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil
}

// Delete removes the cluster and its processes (and ContextKubeconfig).
func (c *Cluster) Delete(ctx context.Context) error {
	if c.ContextKubeconfig == "" {
		return c.kwokctl(ctx, "delete", "cluster")
	}
	err := c.kwokctl(ctx, "delete", "cluster", "--kubeconfig", c.ContextKubeconfig)
	_ = os.Remove(c.ContextKubeconfig)
	return err
}

// LogsDir is where kwokctl keeps each component's log.
func (c *Cluster) LogsDir() string { return filepath.Join(c.WorkDir, "clusters", c.Name, "logs") }

// Kubectl runs kubectl as the admin and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	bin := c.KubectlBin
	if bin == "" {
		bin = "kubectl"
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Dir = c.Root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, tail(out))
	}
	return string(out), nil
}

// Install installs gpuhealth as a user would, with its Helm chart and the
// remediation profile: the CRDs, the operator's and the monitor's RBAC, the
// admission policy, the monitor DaemonSet (kwok runs its pods; the suite's
// agents authenticate as them) and the default RemediationPolicy. The
// operator's Deployment gets no replicas: the suite runs the operator as a
// host process, as its service account.
func (c *Cluster) Install(ctx context.Context) error {
	args := append([]string{"upgrade", "--install", ReleaseName, "charts/gpuhealth", "--namespace", Namespace, "--create-namespace",
		"-f", "charts/gpuhealth/values-remediation.yaml", "--set", "operator.replicas=0", "--wait", "--timeout", "2m"}, JobValues()...)
	_, err := c.Helm(ctx, args...)
	return err
}

// JobImagePrefixes are the images the suites' policies' Jobs may use: the
// default policy's, and registry.invalid/, the fake images kwok "runs".
var JobImagePrefixes = []string{"nvcr.io/nvidia/", "registry.k8s.io/e2e-test-images/agnhost:", "registry.invalid/"}

// JobValues are the chart arguments that allow JobImagePrefixes.
func JobValues() []string {
	return []string{"--set-json", `jobs.allowedImagePrefixes=["` + strings.Join(JobImagePrefixes, `","`) + `"]`}
}

// ReleaseName is the suite's Helm release.
const ReleaseName = "gpuhealth"

// Helm runs helm against the cluster (HELM, or the repository's bin/helm-v3.22.0)
// and returns its combined output.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	bin := os.Getenv("HELM")
	if bin == "" {
		bin = filepath.Join(c.Root, "bin", "helm-v3.22.0")
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Dir = c.Root
	// Helm's caches and repository config stay with the cluster.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(c.WorkDir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.WorkDir, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(c.WorkDir, "helm", "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, tail(out))
	}
	return string(out), nil
}

// TokenKubeconfig writes a kubeconfig that authenticates only with a
// service-account token (no client certificate, so the RBAC is the service
// account's). When podName is set the token is bound to that pod, which makes
// the apiserver put the pod's node into the request's user info.
func (c *Cluster) TokenKubeconfig(ctx context.Context, path, namespace, serviceAccount, podName string) error {
	exp := int64((6 * time.Hour).Seconds())
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}
	if podName != "" {
		pod, err := c.Clientset.CoreV1().Pods(namespace).Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading pod %s/%s to bind a token to: %w", namespace, podName, err)
		}
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := c.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating a token for %s/%s: %w", namespace, serviceAccount, err)
	}
	ca := c.Config.CAData
	if len(ca) == 0 && c.Config.CAFile != "" {
		if ca, err = os.ReadFile(c.Config.CAFile); err != nil {
			return fmt.Errorf("reading the cluster CA: %w", err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: ca, InsecureSkipTLSVerify: len(ca) == 0 && c.Config.Insecure}
	kc.AuthInfos[serviceAccount] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: serviceAccount}
	kc.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*kc, path)
}

// Poll calls check every 200 ms until it returns true or timeout passes; the
// error carries check's last message.
func Poll(ctx context.Context, timeout time.Duration, check func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := check()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s: %s", timeout, msg)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), errors.New(msg))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Tail returns at most the last n bytes of a command's output or a log,
// as trimmed text, for an error message.
func Tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// tail is the end of a command's output, for an error.
func tail(b []byte) string { return Tail(b, 3000) }

// exited reports whether process pid is gone or a zombie (kwokctl's
// components are not our children; nobody may reap them in a container).
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z'
}
