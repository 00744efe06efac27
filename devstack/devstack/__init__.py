"""smoothscale's test bed, for tests and demos only: it ships in no image.

The local control plane (a Kubernetes API server, Deployment and ReplicaSet controllers, a
process kubelet), the embedded Kafka behind a front that administers topics like a real cluster
(`devstack.kafka`), and the scaling demo with the scenario harness the tests use
(`devstack.demo`), so the operator can be run and tested end to end without a cluster
(docs/local-control-plane.md). It may import smoothscale; smoothscale never imports it
(tests/test_layout.py). It adds `smoothscale dev` and `smoothscale demo` through the
`smoothscale.commands` entry points its pyproject.toml declares.
"""
