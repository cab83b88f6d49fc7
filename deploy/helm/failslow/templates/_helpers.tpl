{{- define "failslow.name" -}}{{ .Release.Name }}-failslow{{- end -}}
{{- define "failslow.secret" -}}{{ if .Values.tokens.create }}{{ include "failslow.name" . }}-tokens{{ else }}{{ .Values.tokens.existingSecret }}{{ end }}{{- end -}}
{{/* What selectors match: stable across upgrades (no chart version in them). */}}
{{- define "failslow.selectorLabels" -}}
app.kubernetes.io/name: failslow
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{/* Every object's labels: the selector's plus the standard ones of Helm charts. */}}
{{- define "failslow.labels" -}}
{{ include "failslow.selectorLabels" . }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "failslow.serviceAccount" -}}{{ default (include "failslow.name" .) .Values.serviceAccount.name }}{{- end -}}
{{/* The socket the training pods send to: one for every job, or one job's. */}}
{{- define "failslow.agentSocket" -}}{{ if .Values.agent.job }}/run/failslow/failslow-{{ .Values.agent.job }}.sock{{ else }}/run/failslow/failslow.sock{{ end }}{{- end -}}
