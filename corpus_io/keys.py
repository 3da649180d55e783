"""Keys by hash: a stable 64-bit hash per key (8 bytes of memory each) and the repeated ones among them.

How tables, inputs, shards and jobs find a duplicate key without holding the keys: collect
:func:`key_hash` values in an int64 array and ask :func:`first_repeated_key`, which re-reads the keys only when two
hashes match, to name both places (:func:`duplicate_hashes`: the repeated hashes alone, for a caller that wants them
all). Below every wing that checks keys (tables, jobs).
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any, Callable, Iterable

import numpy as np

from corpus_io.errors import DataError, excerpt


def _breaks_token(c: str) -> bool:
    # ASCII whitespace is what Kaldi's table readers split at; control, format and surrogate characters are never
    # part of a name (a no-break space is: a Kaldi table keeps it, tests/test_messages.py)
    return c in " \t\n\r\v\f" or unicodedata.category(c) in ("Cc", "Cf", "Cs")


def is_one_token(text: str) -> bool:
    """Whether ``text`` is non-empty and has no character that :func:`one_token` refuses."""
    return bool(text) and not any(_breaks_token(c) for c in text)


def one_token(key: str, where: str, *, name: str = "key", tables: str = "a Kaldi table written from it (text, "
              "wav.scp, utt2spk)", fix: str = "A key is one token: rename the utterance") -> str:
    """``key`` when it is one token: no whitespace and no control or format character, which a Kaldi table written
    from it (``text``, ``wav.scp``, ``utt2spk``) or any reader splitting at whitespace would cut in two; else a
    DataError naming ``where`` (``file:line``, ``file row N``) and the character. Every reader of keys asks it;
    ``name``, ``tables`` and ``fix`` word the message for another id (a recording id: :func:`recording_id`)."""
    bad = next((i for i, c in enumerate(key) if _breaks_token(c)), None)
    if bad is None:
        return key
    c = key[bad]
    what = "whitespace" if c.isspace() else "a control character"
    fixed = "".join("_" if _breaks_token(x) else x for x in key)
    raise DataError(f"{where}: {name} {excerpt(key)} is not one word: it holds {what} (U+{ord(c):04X}) at character "
                    f"{bad + 1}, and {tables} would split it there. {fix} (e.g. {excerpt(fixed)}), then rerun.")


def recording_id(value: str, where: str) -> str:
    """A recording id (a Kaldi ``segments`` line's second field, a list line's ``recording``): one token as a key
    is (:func:`one_token`), since decode's CTM names the recording in its first field."""
    return _id(value, where, name="recording id", tables="a CTM, segments or reco2dur file written from it",
               fix="A recording id is one token: rename the recording")


def speaker_id(value: str, where: str) -> str:
    """A speaker id (a list line's ``speaker``, a Kaldi ``utt2spk`` value): one token as a key is
    (:func:`one_token`), since ``utt2spk`` and ``spk2utt`` (written by jsonl2scp, segment) hold it as one field."""
    return _id(value, where, name="speaker", tables="an utt2spk or spk2utt file written from it",
               fix="A speaker id is one token: rename the speaker")


def _id(value: str, where: str, *, name: str, tables: str, fix: str) -> str:
    if not value:  # a key's reader refuses an empty key itself; an empty id would leave its field out of a line
        raise DataError(f"{where}: {name} is empty, and {tables} would lose that field. {fix} (any non-empty "
                        f"word without spaces), or drop the field, then rerun.")
    return one_token(value, where, name=name, tables=tables, fix=fix)


def key_hash(key: str) -> int:
    """A stable 64-bit hash of a key (signed, to fit numpy int64)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def duplicate_hashes(hashes: Any, most: int | None = 8, *, in_place: bool = False) -> set[int]:
    """The :func:`key_hash` values that occur more than once (at most ``most`` of them, None: all); empty if none.
    ``in_place``: sort ``hashes`` (a writable int64 array) itself instead of a copy (8 bytes per key less)."""
    h = np.asarray(hashes, dtype=np.int64)
    if in_place:
        h.sort()
    else:
        h = np.sort(h)
    return {int(x) for x in np.unique(h[1:][h[1:] == h[:-1]])[:most]}


def first_repeat(keyed: Iterable[tuple[str, str]], wanted: set[int]) -> tuple[str, str, str] | None:
    """``(key, first where, second where)`` of the first key seen twice among ``(key, where)`` pairs, looking
    only at keys whose hash is in ``wanted`` (from :func:`duplicate_hashes`); None when the equal hashes
    were a 64-bit collision of different keys."""
    first: dict[str, str] = {}
    for key, where in keyed:
        if key_hash(key) not in wanted:
            continue
        if key in first:
            return key, first[key], where
        first[key] = where
    return None


def first_repeated_key(hashes: Any, keyed: Callable[[], Iterable[tuple[str, str]]]) -> tuple[str, str, str] | None:
    """``(key, first where, second where)`` of the first key held twice, given the :func:`key_hash` of every key
    (an int64 array or ``array("q")``: 8 bytes per key) and ``keyed()``, which reads the ``(key, where)`` pairs
    again in the same order: called only when two hashes match. None when no key repeats."""
    wanted = duplicate_hashes(hashes)
    return first_repeat(keyed(), wanted) if wanted else None


class ExcludedKeys:
    """The keys of ``++exclude_keys=<file>``: the first field of each non-blank line, so a plain list of keys, a
    Kaldi table (``text``, ``utt2spk``) and score's ``flagged`` file (``<key> <reasons>``) are all taken as they
    are. :meth:`excludes` answers for a record and remembers the keys it met, so the keys of the file that are not
    in the input are reported (:meth:`report`)."""

    def __init__(self, path: str, option: str = "++exclude_keys") -> None:
        self.path, self.option = str(path), option
        self.reason = f"excluded by {option}"  # the skip reason in a command's summary
        self.keys: set[str] = set()
        self.met: set[str] = set()
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    fields = line.split(maxsplit=1)
                    if fields:
                        self.keys.add(fields[0])
        except FileNotFoundError:
            raise DataError(f"{option}={self.path} does not exist. Give a file of keys to leave out, one a line "
                            f"(score's output_dir/flagged as it is, or any file whose lines start with a key).") \
                from None
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{option}={self.path} cannot be read as UTF-8 text ({exc}). Give a file of keys to "
                            f"leave out, one a line.") from None

    def excludes(self, key: str) -> bool:
        if key in self.keys:
            self.met.add(key)
            return True
        return False

    def report(self, command: str, *, whole_input: bool = True) -> str:
        """How many keys of the file were left out, and (``whole_input``: the command read all of its input) how
        many of them the input does not hold, with examples."""
        line = f"[{command}] {self.option}={self.path}: {len(self.met)} of its {len(self.keys)} keys left out"
        missing = len(self.keys) - len(self.met)
        if whole_input and missing:
            examples = ", ".join(excerpt(k) for k in sorted(self.keys - self.met)[:3])
            line += (f"; {missing} {'is' if missing == 1 else 'are'} not in the input (e.g. {examples}): a file of "
                     f"another list, or keys renamed since it was written")
        return line
