"""The session-windows processor (examples/processors/session_windows.py) in the store of the
scenarios' StreamingApp (devstack.demo.scenario.STORE): the pipeline of
test_processor_scaling.py's pods, unchanged otherwise."""

import dataclasses

from examples.processors import session_windows

from devstack.demo.scenario import STORE
from smoothscale.runtime.processor import ProcessorPipeline


def pipeline() -> ProcessorPipeline:
    return dataclasses.replace(session_windows.pipeline(), store=STORE)
