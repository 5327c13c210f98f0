"""The REST API: FastAPI routes over the control plane, bearer auth, one error shape, Prometheus metrics."""
