// Package realnode is gpuhealth's real-node end-to-end tier (build tag
// e2enode, `make e2e-node`): hack/realnode.sh runs a kubelet with
// containerd on this machine, the chart is installed with helm, and the
// operator's and monitor's pods, the workloads and the remediation and
// recertification Jobs run as real containers. docs/e2e.md says what is
// real and what is still faked.
package realnode
