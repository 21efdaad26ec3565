"""Shared test settings."""

from hypothesis import settings

# Property tests draw the same examples on every run: CI is reproducible, and a failure seen
# once is seen again. Explore new examples locally with `--hypothesis-profile=explore`.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile("ci")
