"""The Kubernetes backend: pods from per-pool templates, watched by label, rebuilt from their annotations.

`backend` implements the `Backend` port on the official `kubernetes` client; `manifests` builds pod and
Secret manifests from a pool's `template`; `watching` keeps the pod cache in step with the API server
(resourceVersion, 410 re-list, bookmarks); `hami` reads and writes HAMi's GPU-sharing annotations;
`ratelimit` paces creates. Only `backend` imports `kubernetes`.
"""
