{{/*
Object names are fixed, not derived from the release name: the binaries default to them
(operator/src/main.rs: --ca-secret, --agent-secret, --lease-name) and the agent finds the
operator through the RESOURCEWATCH_OPERATOR_SERVICE_* variables kubelet injects for the
Service named resourcewatch-operator.
*/}}
{{- define "resourcewatch.operator.name" -}}resourcewatch-operator{{- end }}
{{- define "resourcewatch.agent.name" -}}resourcewatch-agent{{- end }}

{{/* chart label: name-version, as `helm create` does. */}}
{{- define "resourcewatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels Helm adds for its own bookkeeping. Only on objects' metadata.labels, never on
selectors or pod templates, so the objects stay identical to config/ otherwise.
*/}}
{{- define "resourcewatch.helmLabels" -}}
helm.sh/chart: {{ include "resourcewatch.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* Selector labels: must stay exactly as in config/ (selectors are immutable). */}}
{{- define "resourcewatch.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "resourcewatch.operator.name" . }}
{{- end }}
{{- define "resourcewatch.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "resourcewatch.agent.name" . }}
{{- end }}

{{/* Pod labels: selector labels plus part-of, as in config/. */}}
{{- define "resourcewatch.operator.podLabels" -}}
{{ include "resourcewatch.operator.selectorLabels" . }}
app.kubernetes.io/part-of: resourcewatch
{{- end }}
{{- define "resourcewatch.agent.podLabels" -}}
{{ include "resourcewatch.agent.selectorLabels" . }}
app.kubernetes.io/part-of: resourcewatch
{{- end }}

{{/* Object labels: pod labels plus Helm's. */}}
{{- define "resourcewatch.operator.labels" -}}
{{ include "resourcewatch.operator.podLabels" . }}
{{ include "resourcewatch.helmLabels" . }}
{{- end }}
{{- define "resourcewatch.agent.labels" -}}
{{ include "resourcewatch.agent.podLabels" . }}
{{ include "resourcewatch.helmLabels" . }}
{{- end }}

{{/* repository:tag, the tag defaulting to the chart's appVersion. Call with an image dict and the root: (dict "image" .Values.operator.image "root" .) */}}
{{- define "resourcewatch.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion | toString -}}
{{- printf "%s:%s" (required "image.repository is required" .image.repository) $tag -}}
{{- end }}
