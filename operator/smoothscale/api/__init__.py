"""The StreamingApp API: pydantic models (the single source of the CRD schema), the CRD
generator, and validation of custom resources as the Kubernetes API server does it."""
