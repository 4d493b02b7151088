{{/*
Names. Every object is named "<fullname>-<what>": fullname is fullnameOverride, else
nameOverride, else "resourcewatch" (also app.kubernetes.io/part-of). The release name is
not part of it: the CRDs are cluster-wide, so a cluster holds one installation, and the
defaults give config/'s names, which the binaries default to (operator/shell/src/main.rs:
--service-name, --ca-secret, --agent-secret, --metrics-client-secret, --ca-bundle-configmap,
--lease-name, --agent-service-account, --evictor-cluster-role; the agent's
--operator-service). Renamed, the chart passes each of them ("resourcewatch.renamed").
Certificate names (resourcewatch-agent, resourcewatch-metrics-client) and the agents'
token audience (resourcewatch-operator) name the product, not objects: they stay.
*/}}
{{- define "resourcewatch.name" -}}{{ .Values.nameOverride | default "resourcewatch" }}{{- end }}
{{- define "resourcewatch.fullname" -}}{{ .Values.fullnameOverride | default (include "resourcewatch.name" .) }}{{- end }}
{{/* "true" when the names differ from the binaries' defaults (empty otherwise). */}}
{{- define "resourcewatch.renamed" -}}{{ if ne (include "resourcewatch.fullname" .) "resourcewatch" }}true{{ end }}{{- end }}
{{- define "resourcewatch.operator.name" -}}{{ include "resourcewatch.fullname" . }}-operator{{- end }}
{{- define "resourcewatch.agent.name" -}}{{ include "resourcewatch.fullname" . }}-agent{{- end }}
{{/* The ServiceAccounts: <x>.serviceAccount.name, else the workload's name. */}}
{{- define "resourcewatch.operator.serviceAccount" -}}{{ .Values.operator.serviceAccount.name | default (include "resourcewatch.operator.name" .) }}{{- end }}
{{- define "resourcewatch.agent.serviceAccount" -}}{{ .Values.agent.serviceAccount.name | default (include "resourcewatch.agent.name" .) }}{{- end }}
{{- define "resourcewatch.caSecret" -}}{{ include "resourcewatch.fullname" . }}-ca{{- end }}
{{- define "resourcewatch.agentSecret" -}}{{ include "resourcewatch.fullname" . }}-agent-tls{{- end }}
{{- define "resourcewatch.metricsClientSecret" -}}{{ include "resourcewatch.fullname" . }}-metrics-client{{- end }}
{{- define "resourcewatch.caBundle" -}}{{ include "resourcewatch.fullname" . }}-ca-bundle{{- end }}
{{/* The prefix of the variables kubelet injects for the operator Service (no DNS needed). */}}
{{- define "resourcewatch.operator.env" -}}{{ include "resourcewatch.operator.name" . | upper | replace "-" "_" }}{{- end }}

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
app.kubernetes.io/part-of: {{ include "resourcewatch.name" . }}
{{- end }}
{{- define "resourcewatch.agent.podLabels" -}}
{{ include "resourcewatch.agent.selectorLabels" . }}
app.kubernetes.io/part-of: {{ include "resourcewatch.name" . }}
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

{{/* [registry/]repository@digest when a digest is set, else [registry/]repository:tag, the tag defaulting to the chart's appVersion. Call with an image dict and the root: (dict "image" .Values.operator.image "root" .) */}}
{{- define "resourcewatch.image" -}}
{{- $repo := required "image.repository is required" .image.repository -}}
{{- if .image.registry }}{{ $repo = printf "%s/%s" .image.registry $repo }}{{ end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion | toString -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end }}
