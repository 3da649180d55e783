"""The trained-model fixtures (tests.trained_models), shared by tests/model, tests/train and tests/infer."""

from tests.recipes.test_smoke import smoke  # noqa: F401, E402  (`make smoke`, built once a session: align, segment)
from tests.trained_models import corpus, one_process, one_step_run, streaming_trained, trained  # noqa: F401
