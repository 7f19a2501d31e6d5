package testenv

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// DriverShape is one shape of NVIDIA's DRA driver API that gpuhealth
// supports: the test CRDs written from that version's schema facts
// (controllers/computedomain/testdata/crd/<version>).
type DriverShape struct {
	// Name is the driver version the shape follows, for test names.
	Name string
	// Dir holds the shape's CRDs.
	Dir string
	// Cliques says whether the shape has the ComputeDomainClique kind
	// (v25.12 and later); v25.8 lists members in status.nodes only and
	// labels no daemon pod with its clique.
	Cliques bool
}

// DriverShapes returns the shapes every ComputeDomain suite runs against.
func DriverShapes() []DriverShape {
	_, file, _, _ := runtime.Caller(0)
	base := filepath.Join(filepath.Dir(file), "..", "..", "..", "controllers", "computedomain", "testdata", "crd")
	return []DriverShape{
		{Name: "v25.8", Dir: filepath.Join(base, "v25.8")},
		{Name: "v25.12", Dir: filepath.Join(base, "v25.12"), Cliques: true},
	}
}

// cliqueCRD is the ComputeDomainClique CRD's name.
const cliqueCRD = "computedomaincliques.resource.nvidia.com"

// UseDriverShape makes the apiserver serve shape s: its CRDs installed (an
// existing ComputeDomain CRD is replaced by the shape's), and the clique
// CRD removed for a shape without it, waiting until discovery agrees.
func UseDriverShape(cfg *rest.Config, c client.Client, s DriverShape) error {
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{s.Dir}, ErrorIfPathMissing: true}); err != nil {
		return fmt.Errorf("installing the %s driver CRDs: %w", s.Name, err)
	}
	ctx := context.Background()
	if !s.Cliques {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		crd.SetName(cliqueCRD)
		if err := c.Delete(ctx, crd); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing the clique CRD for the %s driver: %w", s.Name, err)
		}
	}
	d, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		list, err := d.ServerResourcesForGroupVersion("resource.nvidia.com/v1beta1")
		if err != nil {
			return false, nil //nolint:nilerr // not served yet
		}
		cliques := slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "computedomaincliques" })
		return cliques == s.Cliques, nil
	})
}
