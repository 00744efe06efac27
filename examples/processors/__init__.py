"""Example pyspark StatefulProcessors, each run unchanged by plain transformWithStateInPandas
and by smoothscale (its module's `pipeline()`).

Name one in a StreamingApp as "examples.processors.<module>:pipeline".
"""
