#!/usr/bin/env bash
# Copies the manifests config/ is the source of into the Helm chart's files/
# folder, which the chart's templates read: the CRDs and the operator's RBAC
# (generated from the Go markers), the agent's ClusterRole, IMEX Role and
# admission policy, the manual requests' admission policy, the alerts, PodMonitors and the Grafana dashboard.
# `make generate` runs it; `make verify-generated` fails when the copies
# are stale. Never edit charts/gpuhealth/files by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
out=charts/gpuhealth/files
rm -rf "$out/crds" "$out/rbac" "$out/prometheus" "$out/grafana" "$out/admission_policy.yaml" "$out/request_policy.yaml"
mkdir -p "$out/crds" "$out/rbac" "$out/prometheus" "$out/grafana"
cp config/crd/*.yaml "$out/crds/"
cp config/rbac/role.yaml "$out/rbac/operator-role.yaml"
cp config/rbac/metrics_reader_role.yaml "$out/rbac/metrics-reader-role.yaml"
cp config/monitor/role.yaml "$out/rbac/monitor-role.yaml"
{ cat config/monitor/imex/role.yaml; echo "---"; cat config/monitor/imex/role_binding.yaml; } > "$out/rbac/monitor-imex.yaml"
cp config/monitor/admission_policy.yaml "$out/admission_policy.yaml"
cp config/nodehealth/request_policy.yaml "$out/request_policy.yaml"
cp config/prometheus/podmonitors.yaml config/prometheus/rules.yaml config/prometheus/scraper.yaml "$out/prometheus/"
cp config/grafana/gpuhealth-dashboard.json "$out/grafana/"

# The other way round: the kustomize install's workloads are rendered from
# the chart (its templates are their source), with the chart's defaults and
# without Helm's release labels.
helm=${HELM:-bin/helm-v3.22.0}
render() {
  "$helm" template gpuhealth charts/gpuhealth --namespace gpuhealth-system --set plainManifests=true --show-only "$1" |
    sed '/^# Source: /d'
}
{
  echo "# Generated from charts/gpuhealth/templates/operator.yaml by hack/chartfiles.sh (make generate): edit the chart."
  render templates/operator.yaml
} > config/manager/manager.yaml
{
  echo "# Generated from charts/gpuhealth/templates/monitor.yaml by hack/chartfiles.sh (make generate): edit the chart."
  render templates/monitor.yaml
} > config/monitor/daemonset.yaml
{
  echo "# Generated from charts/gpuhealth/templates/jobs.yaml by hack/chartfiles.sh (make generate): edit the chart."
  render templates/jobs.yaml
} > config/jobs/jobs.yaml

# The whole product as one manifest for `kubectl apply -k config/default`:
# the chart's monitor-only profile, without Helm's release labels, after the
# namespace.
{
  echo "# Generated from charts/gpuhealth (monitor-only profile) by hack/chartfiles.sh (make generate): edit the chart."
  cat config/manager/namespace.yaml
  "$helm" template gpuhealth charts/gpuhealth --namespace gpuhealth-system --set plainManifests=true | sed '/^# Source: /d'
} > config/default/gpuhealth.yaml
