"""Pipelines that are pyspark StatefulProcessors, run per task over the task's store.

`ProcessorPipeline` (pipeline) is what a factory returns; `prepare` checks it at start;
`run_batch` (loop) runs one task's micro-batch; the handle and state variables (state) keep
everything in the task's store under the keys of `keyspace`, as JSON from `codec`.
docs/decisions/stateful-processor.md says how and why.
"""

from smoothscale.runtime.processor.loop import ProcessorOutcome, run_batch
from smoothscale.runtime.processor.pipeline import (
    PreparedProcessor,
    ProcessorPipeline,
    ProcessorRefused,
    prepare,
)

__all__ = [
    "PreparedProcessor",
    "ProcessorOutcome",
    "ProcessorPipeline",
    "ProcessorRefused",
    "prepare",
    "run_batch",
]
