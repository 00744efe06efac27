"""Example smoothscale pipelines.

Name one in a StreamingApp as "examples.pipelines.<module>:pipeline".
"""
