// Package jobs holds no code: its tests apply the manifests in this folder
// (the chart's gpuhealth-job service account, the install's Job rules and
// the admission policy on RemediationPolicies) to a real apiserver and
// check what a policy editor may write.
package jobs
