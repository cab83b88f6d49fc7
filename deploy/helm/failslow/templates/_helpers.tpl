{{- define "failslow.name" -}}{{ .Release.Name }}-failslow{{- end -}}
{{- define "failslow.secret" -}}{{ if .Values.tokens.create }}{{ include "failslow.name" . }}-tokens{{ else }}{{ .Values.tokens.existingSecret }}{{ end }}{{- end -}}
{{- define "failslow.labels" -}}
app.kubernetes.io/name: failslow
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
