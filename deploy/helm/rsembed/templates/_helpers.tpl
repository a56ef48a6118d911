{{/* Names and labels. */}}
{{- define "rsembed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rsembed.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rsembed.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "rsembed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "worker"). */}}
{{- define "rsembed.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rsembed.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "rsembed.workerName" -}}
{{ include "rsembed.fullname" . }}-worker
{{- end }}

{{- define "rsembed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rsembed.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rsembed.image" -}}
{{ .image.repository }}:{{ default .ctx.Chart.AppVersion .image.tag }}
{{- end }}

{{/*
The work queue's JetStream names. They are fixed in rsembed
(worker/src/queue/mod.rs, QueueConfig::default) and every job shares them;
tests/helm_chart.rs checks that these equal what the coordinator creates.
*/}}
{{- define "rsembed.taskStream" -}}RSEMBED_TASKS{{- end }}
{{- define "rsembed.taskConsumer" -}}rsembed-workers{{- end }}

{{/* The in-chart NATS's full name, as the nats chart computes it. */}}
{{- define "rsembed.natsFullname" -}}
{{- if .Values.nats.fullnameOverride }}
{{- .Values.nats.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "nats" .Values.nats.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rsembed.natsUrl" -}}
{{- if .Values.queue.url }}
{{- .Values.queue.url }}
{{- else if .Values.nats.enabled }}
{{- printf "nats://%s.%s.svc.%s:4222" (include "rsembed.natsFullname" .) .Release.Namespace .Values.clusterDomain }}
{{- else }}
{{- fail "queue.url is required when nats.enabled=false (the URL of an existing NATS >= 2.10 with JetStream)" }}
{{- end }}
{{- end }}

{{/* host:port of NATS's monitoring endpoint (/jsz), for KEDA. */}}
{{- define "rsembed.natsMonitoring" -}}
{{- if .Values.queue.monitoringEndpoint }}
{{- .Values.queue.monitoringEndpoint }}
{{- else if .Values.nats.enabled }}
{{- printf "%s-headless.%s.svc.%s:%v" (include "rsembed.natsFullname" .) .Release.Namespace .Values.clusterDomain .Values.nats.config.monitor.port }}
{{- else }}
{{- fail "queue.monitoringEndpoint is required for keda.enabled with nats.enabled=false (host:port of the NATS monitoring endpoint)" }}
{{- end }}
{{- end }}

{{- define "rsembed.objectStoreSecret" -}}
{{- if .Values.objectStore.existingSecret }}
{{- .Values.objectStore.existingSecret }}
{{- else if .Values.objectStore.inlineCredentials }}
{{- include "rsembed.fullname" . }}-object-store
{{- end }}
{{- end }}

{{- define "rsembed.modelDir" -}}
/models/{{ .Values.model.name }}
{{- end }}

{{/*
Environment of every rsembed container: NATS connection, object storage, the
model and logs. Secrets only by reference.
*/}}
{{- define "rsembed.commonEnv" -}}
- name: RSEMBED_NATS
  value: {{ include "rsembed.natsUrl" . | quote }}
{{- $auth := .Values.queue.auth }}
{{- if eq $auth.type "userPassword" }}
- name: RSEMBED_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret }}
      key: {{ $auth.userKey }}
- name: RSEMBED_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret }}
      key: {{ $auth.passwordKey }}
{{- else if eq $auth.type "token" }}
- name: RSEMBED_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret }}
      key: {{ $auth.tokenKey }}
{{- else if eq $auth.type "creds" }}
- name: RSEMBED_NATS_CREDS
  value: /etc/rsembed/nats-auth/{{ $auth.credsKey }}
{{- else if eq $auth.type "nkey" }}
- name: RSEMBED_NATS_NKEY
  value: /etc/rsembed/nats-auth/{{ $auth.nkeyKey }}
{{- end }}
{{- $tls := .Values.queue.tls }}
{{- if $tls.enabled }}
- name: RSEMBED_NATS_TLS
  value: "true"
{{- if $tls.existingSecret }}
- name: RSEMBED_NATS_TLS_CA
  value: /etc/rsembed/nats-tls/{{ $tls.caKey }}
{{- if $tls.clientCert }}
- name: RSEMBED_NATS_TLS_CERT
  value: /etc/rsembed/nats-tls/{{ $tls.certKey }}
- name: RSEMBED_NATS_TLS_KEY
  value: /etc/rsembed/nats-tls/{{ $tls.keyKey }}
{{- end }}
{{- end }}
{{- end }}
- name: RSEMBED_MODEL
  value: {{ include "rsembed.modelDir" . | quote }}
- name: RSEMBED_FP16
  value: {{ .Values.model.fp16 | quote }}
- name: RSEMBED_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
- name: RSEMBED_LOG
  value: {{ .Values.log.level | quote }}
{{- range $k, $v := .Values.objectStore.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end }}

{{- define "rsembed.envFrom" -}}
{{- with include "rsembed.objectStoreSecret" . -}}
envFrom:
  - secretRef:
      name: {{ . }}
{{- end }}
{{- end }}

{{/* Volumes for NATS credentials and TLS files, the model and /tmp. */}}
{{- define "rsembed.volumes" -}}
- name: tmp
  emptyDir: {}
- name: model
{{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required when model.source=pvc" .Values.model.pvc.claimName }}
    readOnly: true
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.model.objectStore.sizeLimit }}
{{- end }}
{{- if has .Values.queue.auth.type (list "creds" "nkey") }}
- name: nats-auth
  secret:
    secretName: {{ .Values.queue.auth.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if and .Values.queue.tls.enabled .Values.queue.tls.existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ .Values.queue.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "rsembed.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: model
  mountPath: {{ include "rsembed.modelDir" . }}
  readOnly: true
{{- if and (eq .Values.model.source "pvc") .Values.model.pvc.subPath }}
  subPath: {{ .Values.model.pvc.subPath }}
{{- end }}
{{- if has .Values.queue.auth.type (list "creds" "nkey") }}
- name: nats-auth
  mountPath: /etc/rsembed/nats-auth
  readOnly: true
{{- end }}
{{- if and .Values.queue.tls.enabled .Values.queue.tls.existingSecret }}
- name: nats-tls
  mountPath: /etc/rsembed/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/*
The init container that copies the model from object storage with rsembed
itself: (dict "ctx" $ "securityContext" ...). It runs as the pod's user, so
the emptyDir (group-owned through fsGroup) is writable.
*/}}
{{- define "rsembed.fetchModel" -}}
{{- $ := .ctx }}
{{- if eq $.Values.model.source "objectStore" }}
- name: fetch-model
  image: {{ include "rsembed.image" (dict "ctx" $ "image" $.Values.job.image) }}
  imagePullPolicy: {{ $.Values.job.image.pullPolicy }}
  args:
    - fetch-model
    - --from
    - {{ required "model.objectStore.url is required when model.source=objectStore" $.Values.model.objectStore.url | quote }}
    - --to
    - {{ include "rsembed.modelDir" $ }}
  env:
    - name: RSEMBED_LOG_FORMAT
      value: {{ $.Values.log.format | quote }}
    {{- range $k, $v := $.Values.objectStore.env }}
    - name: {{ $k }}
      value: {{ $v | quote }}
    {{- end }}
  {{- with include "rsembed.envFrom" $ }}
  {{- . | nindent 2 }}
  {{- end }}
  volumeMounts:
    - name: model
      mountPath: {{ include "rsembed.modelDir" $ }}
    - name: tmp
      mountPath: /tmp
  resources:
    {{- toYaml $.Values.model.objectStore.resources | nindent 4 }}
  securityContext:
    {{- toYaml .securityContext | nindent 4 }}
{{- end }}
{{- end }}

{{/* Pod annotations: the user's, and a checksum of a chart-made Secret so pods restart when it changes. */}}
{{- define "rsembed.podAnnotations" -}}
{{- $ann := deepCopy (default (dict) .annotations) }}
{{- if .ctx.Values.objectStore.inlineCredentials }}
{{- $_ := set $ann "checksum/object-store" (toJson .ctx.Values.objectStore.inlineCredentials | sha256sum) }}
{{- end }}
{{- with $ann }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Checks no schema can express. */}}
{{- define "rsembed.validate" -}}
{{- if le (int .Values.worker.terminationGracePeriodSeconds) (int .Values.worker.shutdownGraceSeconds) }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%v) must be greater than worker.shutdownGraceSeconds (%v): Kubernetes would kill workers before they hand their tasks back" .Values.worker.terminationGracePeriodSeconds .Values.worker.shutdownGraceSeconds) }}
{{- end }}
{{- if and (ne .Values.queue.auth.type "none") (not .Values.queue.auth.existingSecret) }}
{{- fail (printf "queue.auth.existingSecret is required with queue.auth.type=%s" .Values.queue.auth.type) }}
{{- end }}
{{- if and .Values.queue.tls.clientCert (not .Values.queue.tls.existingSecret) }}
{{- fail "queue.tls.existingSecret is required with queue.tls.clientCert" }}
{{- end }}
{{- if and .Values.objectStore.existingSecret .Values.objectStore.inlineCredentials }}
{{- fail "set objectStore.existingSecret or objectStore.inlineCredentials, not both" }}
{{- end }}
{{- end }}

{{/* The coordinator Job's environment: (dict "ctx" $ "input" ... "output" ...). */}}
{{- define "rsembed.jobEnv" -}}
{{- $q := .ctx.Values.queue -}}
{{ include "rsembed.commonEnv" .ctx }}
- name: RSEMBED_INPUT
  value: {{ .input | quote }}
- name: RSEMBED_OUTPUT
  value: {{ .output | quote }}
- name: RSEMBED_ACK_WAIT
  value: {{ $q.ackWait | quote }}
- name: RSEMBED_MAX_DELIVER
  value: {{ $q.maxDeliver | quote }}
- name: RSEMBED_MAX_ACK_PENDING
  value: {{ $q.maxAckPending | quote }}
- name: RSEMBED_STREAM_REPLICAS
  value: {{ $q.streamReplicas | quote }}
{{- end }}
