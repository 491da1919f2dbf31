import pytest
from absl import flags


@pytest.fixture
def parsed_flags():
    """Launch code reads flag values, which absl refuses before FLAGS is parsed; the defaults stand in."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
