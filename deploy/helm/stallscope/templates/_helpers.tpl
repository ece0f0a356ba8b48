{{/* The release's full name, at most 63 characters. */}}
{{- define "stallscope.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "stallscope.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Labels that select the daemon's pods. */}}
{{- define "stallscope.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "stallscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stallscope.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the API token, if any. */}}
{{- define "stallscope.tokenSecret" -}}
{{- if .Values.apiToken.existingSecret -}}
{{- .Values.apiToken.existingSecret -}}
{{- else if .Values.apiToken.create -}}
{{- printf "%s-token" (include "stallscope.fullname" .) -}}
{{- end -}}
{{- end -}}
