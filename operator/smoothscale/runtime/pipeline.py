"""The programming model: what a user's pipeline is and how the runtime finds it.

A pipeline is a module with a factory function returning a `Pipeline`, or a `ProcessorPipeline`
(a pyspark StatefulProcessor, smoothscale.runtime.processor); the StreamingApp names it as
"module:callable" (docs/programming-model.md). Each micro-batch, the runtime decodes the
input records with `value_schema`, hands the decoded batch of the instance's active tasks to
`aggregate` (Spark, vectorised: one update per (partition, key)), then calls `apply` on the
driver for each update with the key's old state from its task's store. New states and outputs
are committed atomically with the task's input position.
"""

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from smoothscale.runtime.processor.pipeline import PreparedProcessor

Output = tuple[str, Any]
"""An output record: its key, and a JSON-able value."""

Apply = Callable[[str, Any, Any], tuple[Any, list[Output]]]
"""(key, old state or None, update) -> (new state or None to delete the key, outputs)."""


class PipelineError(ValueError):
    """A pipeline reference or definition the runtime cannot use; the message says how to fix it."""


@dataclass(frozen=True)
class Pipeline:
    """A keyed stateful update, in two halves: a Spark aggregation and a per-key fold.

    `aggregate` turns a decoded micro-batch into at most one update per (partition, key); the
    runtime keeps the state and calls `apply` once per update with the state that key had
    before the batch.
    """

    store: str
    """The state store the pipeline updates (a name from the StreamingApp's kafka.stores)."""
    value_schema: str
    """Spark DDL of the JSON record value, e.g. "user STRING, amount LONG"."""
    key_column: str
    """The state key after decoding: "key" (the record key) or a field of `value_schema`."""
    aggregate: "Callable[[DataFrame], DataFrame]"
    """Decoded batch -> updates with columns partition INT, key STRING, update (JSON-able)."""
    apply: Apply
    """Folds one update into one key's state. It must be a pure function of its arguments: a
    batch whose transaction aborts is processed again from the same old states."""

    def __post_init__(self) -> None:
        if not self.store:
            raise PipelineError("a pipeline needs a state store name (Pipeline.store)")
        if not self.value_schema.strip():
            raise PipelineError(
                "a pipeline needs the DDL of its JSON input values (Pipeline.value_schema), "
                'e.g. "user STRING, amount LONG"'
            )
        if not self.key_column:
            raise PipelineError(
                'a pipeline needs a key column (Pipeline.key_column): "key" for the record key, '
                "or a field of the value schema"
            )
        if not callable(self.aggregate) or not callable(self.apply):
            raise PipelineError("Pipeline.aggregate and Pipeline.apply must be callables")


def load_pipeline(ref: str) -> "Pipeline | PreparedProcessor":
    """Import "module:callable", call the factory, and return the Pipeline it builds, or the
    ProcessorPipeline it builds checked and prepared (`ProcessorRefused`, a PipelineError,
    says what smoothscale cannot run)."""
    from smoothscale.runtime.processor.pipeline import ProcessorPipeline, prepare

    module_name, separator, attribute = ref.partition(":")
    if not separator or not module_name or not attribute:
        raise PipelineError(
            f"pipeline reference {ref!r} is not of the form 'module:callable' "
            "(e.g. 'examples.pipelines.running_count:pipeline')"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise PipelineError(
                f"pipeline module {module_name!r} (from {ref!r}) is not importable: "
                f"{error}. Put it on PYTHONPATH or install it in the image"
            ) from error
        raise
    factory = getattr(module, attribute, None)
    if factory is None:
        raise PipelineError(
            f"module {module_name!r} has no attribute {attribute!r} (from {ref!r}); "
            "name a function that returns a smoothscale Pipeline"
        )
    if not callable(factory):
        raise PipelineError(
            f"{ref!r} is a {type(factory).__name__}, not a callable: name a function that "
            "returns a smoothscale Pipeline"
        )
    try:
        inspect.signature(factory).bind()
    except TypeError as error:
        raise PipelineError(
            f"{ref!r} cannot be called without arguments ({error}): name a factory function "
            "that takes none and returns a smoothscale Pipeline"
        ) from error
    except ValueError:
        pass  # a builtin without a signature: let the call itself tell
    pipeline = factory()
    if isinstance(pipeline, ProcessorPipeline):
        return prepare(pipeline)
    if not isinstance(pipeline, Pipeline):
        raise PipelineError(
            f"{ref!r} returned a {type(pipeline).__name__}, not a smoothscale Pipeline "
            "(smoothscale.runtime.pipeline.Pipeline) or ProcessorPipeline "
            "(smoothscale.runtime.processor.ProcessorPipeline)"
        )
    return pipeline
