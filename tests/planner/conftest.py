from hypothesis import settings

# `pytest tests/planner --hypothesis-profile=planner-thorough` searches much longer than the
# default run (100 examples per property), e.g. after changing the planner.
settings.register_profile("planner-thorough", max_examples=3000)
