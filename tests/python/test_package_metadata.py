"""The package metadata a user sees on an index: a description, keywords, classifiers the
index knows, and the readme the wheel carries, as the installed package reports them."""

import tomllib
from importlib import metadata

from conftest import REPO


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_every_classifier_is_one_the_index_knows():
    from trove_classifiers import classifiers

    unknown = [c for c in project()["classifiers"] if c not in classifiers]
    assert not unknown, unknown
    # Planted: a misspelt classifier is not among them.
    assert "Environment :: GPU :: NVIDIA Cuda :: 13" not in classifiers


def test_the_installed_wheel_carries_the_metadata():
    meta = metadata.metadata("graphcheck")
    assert meta["Summary"] == project()["description"]
    assert sorted(meta.get_all("Classifier")) == sorted(project()["classifiers"])
    assert meta["Keywords"].split(",") == project()["keywords"]
    # The readme (the landing page) is the long description the index shows.
    assert meta.get_payload().strip().startswith("# graphcheck")
