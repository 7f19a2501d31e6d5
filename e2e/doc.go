//go:build e2e

// Package e2e is gpuhealth's end-to-end suite: the real gpuhealth-operator
// and gpuhealth-monitor binaries on a local kwok cluster (real kube-apiserver,
// etcd, kube-controller-manager and kube-scheduler; fake GPU nodes and pod
// lifecycles), installed from the project's own manifests in config/ and run
// with their own service accounts' RBAC. Run it with `make e2e`.
//
// One test, TestE2E, runs the cases in the order of one list (cases, in
// cases_test.go), which also says which earlier cases each one reads and
// keeps the cases that take the installation away last; `go test -tags e2e
// -run 'TestE2E/^<case>$' ./e2e/` runs one. docs/e2e.md has the list and
// its rules.
package e2e
