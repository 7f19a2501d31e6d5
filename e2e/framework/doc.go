// Package framework runs gpuhealth on a throwaway kwok cluster for the
// end-to-end suite, the demo, the chaos soak (hack/soak) and the benchmark
// (hack/bench): the cluster (kwokctl with the binary runtime and the cached
// control-plane binaries), the project's manifests, fake GPU nodes, and the
// real gpuhealth-operator and gpuhealth-monitor binaries as host processes,
// each authenticated as its own service account with a token from the
// TokenRequest API.
package framework
