{{- define "icos-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "icos-agent.fullname" -}}
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

{{- define "icos-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "icos-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "icos-agent.labels.service" -}}
{{ include "icos-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: icos-agent
{{- if .Values.commonLabels.chart }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
{{- end }}

{{- define "icos-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "icos-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "icos-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "icos-agent.secretName" -}}
{{- .Values.adminToken.existingSecret | default (printf "%s-admin" (include "icos-agent.fullname" .)) }}
{{- end }}

{{- define "icos-agent.labelsSecretName" -}}
{{- .Values.labelsToken.existingSecret | default (printf "%s-labels" (include "icos-agent.fullname" .)) }}
{{- end }}

{{/* Where the model and the bundle appear inside the agent container. */}}
{{- define "icos-agent.modelPath" -}}
{{- printf "/artifacts/model/%s" .Values.model.file }}
{{- end }}
{{- define "icos-agent.bundlePath" -}}
{{- printf "/artifacts/bundle/%s" .Values.bundle.subPath | trimSuffix "/" }}
{{- end }}

{{/* The agent's config file (agent/config/settings.py); the admin token is never in it. */}}
{{- define "icos-agent.config.settings" -}}
{{- $cfg := dict "mode" .Values.mode "log_level" .Values.logLevel "state_dir" "/var/lib/icos-agent" }}
{{- $model := dict "name" .Values.model.name "version" (toString .Values.model.version) }}
{{- if eq .Values.mode "serve" }}
{{- $_ := set $model "path" (include "icos-agent.modelPath" .) }}
{{- end }}
{{- $_ := set $cfg "model" $model }}
{{- $_ := set $cfg "bundle" (dict "path" (include "icos-agent.bundlePath" .)) }}
{{- $server := dict "host" "0.0.0.0" "port" (int .Values.service.port) }}
{{- if .Values.metrics.port }}
{{- $_ := set $server "metrics_port" (int .Values.metrics.port) }}
{{- end }}
{{- if .Values.admin.port }}
{{- $_ := set $server "admin_port" (int .Values.admin.port) }}
{{- end }}
{{- if .Values.service.grpcPort }}
{{- $_ := set $server "grpc_port" (int .Values.service.grpcPort) }}
{{- end }}
{{- $_ := set $cfg "server" $server }}
{{- if eq .Values.mode "proxy" }}
{{- $_ := set $cfg "upstream" (dict "url" .Values.upstream.url) }}
{{- if .Values.upstream.modelName }}
{{- $_ := set $cfg.upstream "model_name" .Values.upstream.modelName }}
{{- end }}
{{- end }}
{{- toYaml (mergeOverwrite $cfg (deepCopy .Values.config)) }}
{{- end }}

{{/* An init container that fills an emptyDir with an artifact (model or bundle). */}}
{{- define "icos-agent.fetchContainer" -}}
{{- $root := index . 0 }}{{- $what := index . 1 }}{{- $src := index . 2 }}
{{- if eq $src.source "mlflow" }}
- name: fetch-{{ $what }}
  image: {{ include "icos-agent.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command: ["mlflow", "artifacts", "download", "--artifact-uri", {{ $src.mlflow.uri | quote }}, "--dst-path", "/artifacts/{{ $what }}"]
  env:
    - name: MLFLOW_TRACKING_URI
      value: {{ $src.mlflow.trackingUri | default $root.Values.mlflow.trackingUri | quote }}
    - name: HOME
      value: /tmp
  {{- with $root.Values.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.containerSecurityContext | nindent 4 }}
  resources:
    {{- toYaml $root.Values.initResources | nindent 4 }}
  volumeMounts:
    - {name: artifacts-{{ $what }}, mountPath: /artifacts/{{ $what }}}
    - {name: tmp, mountPath: /tmp}
{{- else if eq $src.source "initContainer" }}
- name: fetch-{{ $what }}
  image: {{ $src.initContainer.image | quote }}
  {{- with $src.initContainer.command }}
  command:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $src.initContainer.args }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $src.initContainer.env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.containerSecurityContext | nindent 4 }}
  resources:
    {{- toYaml $root.Values.initResources | nindent 4 }}
  volumeMounts:
    - {name: artifacts-{{ $what }}, mountPath: /artifacts/{{ $what }}}
    - {name: tmp, mountPath: /tmp}
{{- end }}
{{- end }}

{{- define "icos-agent.artifactVolume" -}}
{{- $what := index . 0 }}{{- $src := index . 1 }}
- name: artifacts-{{ $what }}
{{- if eq $src.source "volume" }}
  {{- toYaml $src.volume | nindent 2 }}
{{- else }}
  emptyDir:
    sizeLimit: {{ $src.sizeLimit | default "1Gi" }}
{{- end }}
{{- end }}
