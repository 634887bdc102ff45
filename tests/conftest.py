"""Fixtures for every test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def seeded_torch():
    """Every test starts from the same global random state, whatever ran before it or beside it, so that inputs
    drawn with the global generator (upstream gradients, initial weights) do not depend on the order of the run."""
    torch.manual_seed(0)
    yield
