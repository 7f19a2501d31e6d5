{{/* Labels every object of the release carries. */}}
{{- define "gpuhealth.labels" -}}
app.kubernetes.io/part-of: gpuhealth
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- if not .Values.plainManifests }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
{{- end -}}

{{/* The image of a component: its repository, and its tag and pull policy or the chart's. */}}
{{- define "gpuhealth.image" -}}
{{- $c := index .Values .component -}}
{{- $repo := $c.image.repository -}}
{{- $tag := $c.image.tag | default .Values.image.tag | default .Chart.AppVersion -}}
image: {{ printf "%s:%s" $repo $tag | quote }}
imagePullPolicy: {{ $c.image.pullPolicy | default .Values.image.pullPolicy }}
{{- end -}}

{{/*
A generated file of files/ as one YAML document per "---", each with the
release's labels (and .labels, when given) added. A namespaced object goes
to .namespace, or the release's namespace; a binding's subjects are the
release's service accounts. Each key of .replace found in the file's
text is replaced by its value first.
*/}}
{{- define "gpuhealth.documents" -}}
{{- $root := .root -}}
{{- $namespace := .namespace | default $root.Release.Namespace -}}
{{- $extra := .labels | default dict -}}
{{- $text := $root.Files.Get .file -}}
{{- range $old, $new := .replace | default dict }}{{ $text = replace $old $new $text }}{{ end -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" $text -1 }}
{{- $obj := fromYaml $doc }}
{{- if $obj }}
{{- $meta := $obj.metadata }}
{{- $_ := set $meta "labels" (merge (dict) $extra (fromYaml (include "gpuhealth.labels" $root)) ($meta.labels | default dict)) }}
{{- if hasKey $meta "namespace" }}{{ $_ := set $meta "namespace" $namespace }}{{ end }}
{{- range $obj.subjects | default list }}{{ $_ := set . "namespace" $root.Release.Namespace }}{{ end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The resources a Template hand-off may create, for the operator's
--handoff-resources: each resource.group that operator.handOff.rules grant
create on, sorted, comma-separated. A wildcard, or a group a hand-off
never creates in (the operator refuses them whatever the list says), fails
the render, so the hand-off's rules grant nothing it cannot use.
*/}}
{{- define "gpuhealth.handOffResources" -}}
{{- $out := list -}}
{{- range $i, $rule := .Values.operator.handOff.rules -}}
{{- range $g := $rule.apiGroups -}}
{{- if or (eq $g "*") (has "*" $rule.resources) -}}
{{- fail (printf "operator.handOff.rules[%d]: a hand-off rule names its API groups and resources, without '*'" $i) -}}
{{- end -}}
{{- if has $g (list "" "batch" "apps" "rbac.authorization.k8s.io" "gpuhealth.dev") -}}
{{- fail (printf "operator.handOff.rules[%d]: a hand-off never creates objects of API group %q (refused: the core group, batch, apps, rbac.authorization.k8s.io, gpuhealth.dev)" $i $g) -}}
{{- end -}}
{{- if or (has "create" $rule.verbs) (has "*" $rule.verbs) -}}
{{- range $r := $rule.resources -}}
{{- if not (contains "/" $r) -}}
{{- $out = append $out (printf "%s.%s" $r $g) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $out | uniq | sortAlpha | join "," -}}
{{- end -}}
