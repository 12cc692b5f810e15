{{/* Names and labels shared by every template. */}}

{{/* The chart name, or nameOverride. */}}
{{- define "meshrun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: fullnameOverride, else the release name when it already holds
the chart name (so `helm install meshrun` gives "meshrun", not "meshrun-meshrun"), else
<release>-<chart>. 63 characters: the DNS label limit of Service names.
*/}}
{{- define "meshrun.fullname" -}}
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

{{/* Labels that select the operator pod; never change them (Deployment selectors are immutable). */}}
{{- define "meshrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meshrun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "meshrun.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "meshrun.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: meshrun
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "meshrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "meshrun.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image reference; the tag defaults to the chart's appVersion. */}}
{{- define "meshrun.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
