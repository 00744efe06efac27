"""The example processors (examples/processors) in the store of the scenarios' StreamingApp
(devstack.demo.scenario.STORE): the pipelines of test_processor_scaling.py's pods, unchanged
otherwise."""

import dataclasses

from examples.processors import deduplicate, running_count, session_windows

from devstack.demo.scenario import STORE
from smoothscale.runtime.processor import ProcessorPipeline


def counts() -> ProcessorPipeline:
    return dataclasses.replace(running_count.pipeline(), store=STORE)


def first_seen() -> ProcessorPipeline:
    return dataclasses.replace(deduplicate.pipeline(), store=STORE)


def sessions() -> ProcessorPipeline:
    return dataclasses.replace(session_windows.pipeline(), store=STORE)
