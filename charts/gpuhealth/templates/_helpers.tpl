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
