"""The local control plane: a Kubernetes API server, a process kubelet and an embedded Kafka,
so the operator can be run and tested end to end without a cluster (docs/local-control-plane.md)."""
