"""The instance runtime: the PySpark Structured Streaming app that runs in each pod.

One Spark driver per pod (local mode) runs one streaming query over the pod's active tasks:
`source` reads exactly the assigned Kafka partitions, `decode` parses the records and routes
bad ones to the dead-letter topic, the user's `pipeline` turns a micro-batch into per-key state
updates, and `metrics` serves Prometheus metrics and readiness. The worker wires these together
with the state stores, the changelog, the restore loop and the per-task transactions.
"""
