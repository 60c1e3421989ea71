{{/* Names and labels shared by every object of the release. */}}

{{- define "writ.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "writ.selector" -}}
app.kubernetes.io/name: writ
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "writ.labels" -}}
{{ include "writ.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "writ.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* What the Pod Security "restricted" profile requires of every container. */}}
{{- define "writ.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "writ.podSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurity.runAsUser }}
runAsGroup: {{ .Values.podSecurity.runAsGroup }}
fsGroup: {{ .Values.podSecurity.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The PostgreSQL DSN of a role (no password: it is read from a file). Args: root, role. */}}
{{- define "writ.dsn" -}}
{{- $pg := .root.Values.postgres -}}
postgresql://{{ .role }}@{{ $pg.host }}:{{ $pg.port }}/{{ $pg.database }}?sslmode={{ $pg.sslmode }}
{{- end -}}

{{/* Environment every Writ container gets. */}}
{{- define "writ.commonEnv" -}}
- name: WRIT_NATS_URL
  value: {{ .Values.nats.url | quote }}
- name: WRIT_STREAM_REPLICAS
  value: {{ .Values.nats.streamReplicas | quote }}
- name: WRIT_METRICS_HOST
  value: "0.0.0.0"
- name: WRIT_METRICS_PORT
  value: {{ .Values.probes.port | quote }}
- name: WRIT_DRAIN_TIMEOUT_S
  value: {{ .Values.drainSeconds | quote }}
- name: WRIT_INSTANCE
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
{{- if .Values.telemetry.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.telemetry.otlpEndpoint | quote }}
{{- end }}
- name: OTEL_BSP_EXPORT_TIMEOUT
  value: {{ mul .Values.telemetry.spanFlushSeconds 1000 | quote }}
{{- end -}}

{{/* A service's database settings and its password file. Args: root, name. */}}
{{- define "writ.databaseEnv" -}}
- name: WRIT_DATABASE_URL
  value: {{ include "writ.dsn" (dict "root" .root "role" (printf "%s_%s" .root.Values.postgres.database .name)) | quote }}
- name: WRIT_DATABASE_PASSWORD_FILE
  value: /var/run/secrets/writ/pg/password
{{- end -}}
