"""Fixtures of the data tests: tiny image folders written as JPEG files."""

import pytest

from image_folder import write_image_folder


@pytest.fixture
def image_folder(tmp_path):
    """``image_folder(**kw) -> Path`` of a fresh folder (see :func:`write_image_folder`)."""
    count = [0]

    def make(**kw):
        count[0] += 1
        return write_image_folder(tmp_path / f"images{count[0]}", **kw)
    return make
