"""model_files: the revision hf recorded, the bytes still to fetch, and the free-disk sentence."""

from ansible_collections.moefleet.serving.plugins.module_utils.model_files import (
    bytes_to_download,
    disk_problem,
    local_revision,
)


def test_local_revision_needs_one_commit_for_every_file():
    assert local_revision({"a": "c1", "b": "c1"}) == "c1"
    assert local_revision({"a": "c1", "b": "c2"}) is None
    assert local_revision({"a": "c1", "b": None}) is None


def test_bytes_to_download_counts_files_not_whole_on_disk():
    assert bytes_to_download({"a": 10, "b": 20}, {"a": 10, "b": 5}) == 20
    assert bytes_to_download({"a": 10}, {}) == 10


def test_disk_problem_names_the_fix_only_when_it_does_not_fit():
    assert disk_problem(10, 100, "/srv/m", 50) is None
    sentence = disk_problem(2**40, 2**30, "/srv/m", 0)
    assert "sglang_model_path" in sentence and "1024.0 GiB" in sentence
