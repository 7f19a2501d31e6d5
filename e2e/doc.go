//go:build e2e

// Package e2e is gpuhealth's end-to-end suite: the real gpuhealth-operator
// and gpuhealth-monitor binaries on a local kwok cluster (real kube-apiserver,
// etcd, kube-controller-manager and kube-scheduler; fake GPU nodes and pod
// lifecycles), installed from the project's own manifests in config/ and run
// with their own service accounts' RBAC. Run it with `make e2e`.
package e2e
