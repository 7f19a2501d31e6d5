// Package monitor holds no code: its tests apply the gpuhealth-monitor
// manifests in this folder to a real apiserver and check the RBAC and the
// own-node admission policy they declare.
package monitor
