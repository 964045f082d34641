{{/* Labels every object carries. */}}
{{- define "ambit.labels" -}}
app.kubernetes.io/part-of: ambit
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* An image of ours: ambit.image (dict "ctx" $ "name" "ambit-proxy"). With a digest in
image.digests (by the name without "ambit-"), REGISTRY/NAME@DIGEST: pinned, the tag ignored. */}}
{{- define "ambit.image" -}}
{{- $digest := get (.ctx.Values.image.digests | default dict) (trimPrefix "ambit-" .name) -}}
{{- if $digest -}}
{{ .ctx.Values.image.registry }}/{{ .name }}@{{ $digest }}
{{- else -}}
{{ .ctx.Values.image.registry }}/{{ .name }}:{{ .ctx.Values.image.tag | default .ctx.Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* The trust anchors, required with a message that says how to make them. */}}
{{- define "ambit.trustAnchors" -}}
{{- required "identityTrustAnchorsPEM is required: the PEM of the mesh's trust anchors. Make a PKI with `ambit pki init --out ./pki` and pass --set-file identityTrustAnchorsPEM=./pki/trust-anchor.crt" .Values.identityTrustAnchorsPEM -}}
{{- end }}

{{/* The control plane's SPIFFE identity, which proxies require of it. */}}
{{- define "ambit.controlIdentity" -}}
spiffe://{{ .Values.identityTrustDomain }}/ns/{{ .Release.Namespace }}/sa/ambit-control
{{- end }}

{{/* Where the trust anchors and the issuer are mounted. */}}
{{- define "ambit.trustRootsDir" -}}/etc/ambit/identity/trust-roots{{- end }}
{{- define "ambit.issuerDir" -}}/etc/ambit/identity/issuer{{- end }}
