"""Keys by hash (corpus_io/keys.py): the first repeated key, found from 8-byte hashes and one re-read."""

from __future__ import annotations

from array import array

from corpus_io.keys import first_repeated_key, key_hash


def test_the_first_repeated_key_names_both_places_and_rereads_only_when_two_hashes_match():
    pairs = [("a", "f:1"), ("b", "f:2"), ("c", "f:3"), ("b", "f:4"), ("a", "f:5")]
    reads: list[int] = []

    def keyed():
        reads.append(1)
        return iter(pairs)

    assert first_repeated_key(array("q", (key_hash(k) for k, _ in pairs)), keyed) == ("b", "f:2", "f:4")
    assert len(reads) == 1
    assert first_repeated_key(array("q", (key_hash(k) for k, _ in pairs[:3])), keyed) is None
    assert len(reads) == 1  # no two hashes match: nothing re-read
