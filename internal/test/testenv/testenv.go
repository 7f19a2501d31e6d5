// Package testenv starts the control plane the project's envtest suites run
// against — a real kube-apiserver and etcd, built by hack/controlplane.sh and
// named by KUBEBUILDER_ASSETS — with gpuhealth's CRDs installed, and a client
// that knows the Kubernetes and gpuhealth kinds. One call in a suite's
// TestMain replaces the set-up every suite would otherwise repeat.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/go-logr/logr"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// Env is a running control plane.
type Env struct {
	// Environment is envtest's handle (AddUser, ControlPlane, Stop).
	Environment *envtest.Environment
	// Config authenticates as envtest's admin.
	Config *rest.Config
	// Client is the admin's client with Scheme (it watches too).
	Client client.WithWatch
	// Scheme holds the client-go kinds and gpuhealth's.
	Scheme *k8sruntime.Scheme
}

// Main starts the control plane with config/crd and any extra CRD
// directories (relative to the test's package directory), calls setUp (nil
// for none), runs the suite and stops the control plane; it returns the exit
// code for os.Exit. Controller-runtime's logger is discarded.
func Main(m *testing.M, setUp func(*Env) error, extraCRDDirs ...string) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run 'make test', or export KUBEBUILDER_ASSETS=$(hack/controlplane.sh | tail -1)")
		return 1
	}
	ctrl.SetLogger(logr.Discard())
	env, err := Start(extraCRDDirs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Environment.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	if setUp != nil {
		if err := setUp(env); err != nil {
			fmt.Fprintf(os.Stderr, "setting up the suite: %v\n", err)
			return 1
		}
	}
	return m.Run()
}

// Start starts the control plane; the caller stops it.
func Start(extraCRDDirs ...string) (*Env, error) {
	crd, err := crdDir()
	if err != nil {
		return nil, err
	}
	scheme := k8sruntime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), gpuhealthv1alpha1.AddToScheme(scheme)); err != nil {
		return nil, fmt.Errorf("building the scheme: %w", err)
	}
	e := &envtest.Environment{
		CRDDirectoryPaths:     append([]string{crd}, extraCRDDirs...),
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := e.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest: %w", err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("creating the admin client: %w", err)
	}
	return &Env{Environment: e, Config: cfg, Client: c, Scheme: scheme}, nil
}

// crdDir is config/crd of this checkout, found from this file's location.
func crdDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("locating config/crd: no caller information")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "..", "..", "config", "crd")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("locating config/crd: %w", err)
	}
	return dir, nil
}
