{{/* The chart name, or nameOverride. */}}
{{- define "smoothscale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of every object: fullnameOverride, or the release name with the chart name. */}}
{{- define "smoothscale.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "smoothscale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "smoothscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "smoothscale.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "smoothscale.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "smoothscale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "smoothscale.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: name the existing service account to run the operator as, or set serviceAccount.create=true" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "smoothscale.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The namespaces the operator serves in namespaced mode: watch.namespaces, or the release
namespace. Rendered as a JSON list; read it with fromJsonArray.
*/}}
{{- define "smoothscale.watchedNamespaces" -}}
{{- if .Values.watch.allNamespaces }}
{{- list | toJson }}
{{- else }}
{{- default (list .Release.Namespace) .Values.watch.namespaces | toJson }}
{{- end }}
{{- end }}

{{/*
What the operator does with the Kubernetes API, and nothing more (docs/install.md explains
each rule). `peeringResource` is kopfpeerings (namespaced) or clusterkopfpeerings (cluster-wide).
*/}}
{{- define "smoothscale.rules" -}}
- apiGroups: ["smoothscale.io"]
  resources: ["streamingapps"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["smoothscale.io"]
  resources: ["streamingapps/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["list"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch"]
{{- if .root.Values.peering.enabled }}
- apiGroups: ["kopf.dev"]
  resources: [{{ .peeringResource | quote }}]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* Rules between values that the schema cannot say with a clear message. */}}
{{- define "smoothscale.validateValues" -}}
{{- if and .Values.watch.allNamespaces .Values.watch.namespaces }}
{{- fail (printf "watch.namespaces lists %v but watch.allNamespaces is true, which serves every namespace. Set watch.namespaces=[] for cluster-wide mode, or watch.allNamespaces=false to serve only the listed namespaces." .Values.watch.namespaces) }}
{{- end }}
{{- if and (gt (int .Values.replicas) 1) (not .Values.peering.enabled) }}
{{- fail (printf "replicas is %d but peering.enabled is false: without kopf peering every replica would act on the same StreamingApps at once. Set replicas=1, or peering.enabled=true so that extra replicas wait as hot spares." (int .Values.replicas)) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled is true but metrics.enabled is false: the ServiceMonitor scrapes the metrics Service. Set metrics.enabled=true." }}
{{- end }}
{{- end }}
