"""`corpus-io prepare` on AISHELL-1 and LibriSpeech look-alike trees (real espeak-ng audio, real layouts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import soundfile as sf

from corpus_io.errors import DataError
from corpus_io.tables import corpora, synth
from tests.conftest import assert_user_error, run_cli


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpora")
    synth.make_aishell_lookalike(root)
    synth.make_librispeech_lookalike(root)
    return root


@pytest.fixture
def tree(trees, tmp_path) -> Path:
    """A private copy of the look-alike trees, for tests that damage them."""
    root = tmp_path / "corpora"
    shutil.copytree(trees, root)
    return root


def read(path: Path) -> list[tuple[str, str]]:
    return [tuple(line.split(" ", 1)) for line in path.read_text(encoding="utf-8").splitlines()]


def check_kaldi_dir(data_dir: Path) -> dict[str, tuple[str, str, str]]:
    """Sorted, consistent tables; returns {key: (path, text, spk)}."""
    wav, text, utt2spk, spk2utt = (read(data_dir / n) for n in ("wav.scp", "text", "utt2spk", "spk2utt"))
    keys = [k for k, _ in wav]
    assert keys == sorted(keys, key=lambda k: k.encode()), "wav.scp not sorted"
    assert [k for k, _ in text] == keys and [k for k, _ in utt2spk] == keys
    spks = [s for s, _ in spk2utt]
    assert spks == sorted(spks, key=lambda s: s.encode()), "spk2utt not sorted"
    from_spk2utt = {u: s for s, utts in spk2utt for u in utts.split()}
    assert from_spk2utt == dict(utt2spk)
    for _, path in wav:
        assert Path(path).is_absolute() and sf.info(path).samplerate == 16000
    return {k: (p, t, s) for (k, p), (_, t), (_, s) in zip(wav, text, utt2spk)}


def aishell_transcript(root: Path) -> Path:
    return root / "data_aishell" / "transcript" / "aishell_transcript_v0.8.txt"


# --------------------------------------------------------------------------- AISHELL-1


def test_aishell_splits_become_sorted_kaldi_dirs_without_word_spaces(trees, tmp_path):
    reports = corpora.prepare_aishell(trees, tmp_path / "data")
    expected = dict(read(aishell_transcript(trees)))
    assert [r.split for r in reports] == ["train", "dev", "test"]
    for report in reports:
        utts = check_kaldi_dir(tmp_path / "data" / report.split)
        assert report.utterances == len(utts) == 4 and report.speakers == 2 and report.no_transcript == 0
        for key, (path, text, spk) in utts.items():
            assert Path(path).parent.parent.name == report.split and Path(path).name == f"{key}.wav"
            assert spk == Path(path).parent.name and key == f"BAC009{spk}{key[-5:]}"
            assert " " not in text and text == expected[key].replace(" ", "")


def test_aishell_remove_spaces_false_keeps_transcript_text(trees, tmp_path):
    corpora.prepare_aishell(trees, tmp_path / "data", ["dev"], remove_spaces=False)
    expected = dict(read(aishell_transcript(trees)))
    utts = check_kaldi_dir(tmp_path / "data" / "dev")
    assert not (tmp_path / "data" / "train").exists()
    assert all(text == expected[key] and " " in text for key, (_, text, _) in utts.items())


def test_aishell_root_may_be_data_aishell_itself(trees, tmp_path):
    reports = corpora.prepare_aishell(trees / "data_aishell", tmp_path / "data", ["test"])
    assert reports[0].utterances == 4


def test_aishell_malformed_transcript_line_names_file_and_line(tree, tmp_path):
    transcript = aishell_transcript(tree)
    lines = transcript.read_text(encoding="utf-8").splitlines()
    lines.insert(3, "BAC009S0002W0999")  # a key without text, line 4
    transcript.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli("corpus-io", "prepare", "++corpus=aishell", f"++root={tree}", f"++output_dir={tmp_path}/data")
    assert result.returncode == 2
    assert_user_error(result, f"{transcript}:4", "BAC009S0002W0999")
    assert not (tmp_path / "data" / "train" / "wav.scp").exists()


def test_aishell_duplicate_transcript_key_names_both_lines(tree, tmp_path):
    transcript = aishell_transcript(tree)
    lines = transcript.read_text(encoding="utf-8").splitlines()
    transcript.write_text("\n".join(lines + [lines[0]]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{transcript}:1 and {transcript}:{len(lines) + 1}"):
        corpora.prepare_aishell(tree, tmp_path / "data")


def test_aishell_wav_without_transcript_is_counted_and_left_out(tree, tmp_path):
    spk_dir = tree / "data_aishell" / "wav" / "train" / "S0002"
    shutil.copy(spk_dir / "BAC009S0002W0121.wav", spk_dir / "BAC009S0002W0500.wav")
    result = run_cli("corpus-io", "prepare", "++corpus=aishell", f"++root={tree}", f"++output_dir={tmp_path}/data",
                     "++splits=[train]")
    assert result.returncode == 0, result.stderr
    assert "[prepare train] 4 utterances" in result.stderr
    assert "audio without transcript: 1 (e.g. BAC009S0002W0500)" in result.stderr
    assert "BAC009S0002W0500" not in (tmp_path / "data" / "train" / "wav.scp").read_text()


def test_keys_not_prefixed_by_speaker_are_still_written_sorted(tree, tmp_path):
    spk_dir = tree / "data_aishell" / "wav" / "train" / "S0003"
    (spk_dir / "BAC009S0003W0122.wav").rename(spk_dir / "AAA0001.wav")
    with open(aishell_transcript(tree), "a", encoding="utf-8") as f:
        f.write("AAA0001 你好 世界\n")
    corpora.prepare_aishell(tree, tmp_path / "data", ["train"])
    utts = check_kaldi_dir(tmp_path / "data" / "train")
    assert list(utts)[0] == "AAA0001" and utts["AAA0001"][2] == "S0003"


def test_aishell_transcript_lines_without_audio_are_counted(tree, tmp_path):
    with open(aishell_transcript(tree), "a", encoding="utf-8") as f:
        f.write("BAC009S0900W0121 多 出来 的 一行\n")
    reports = corpora.prepare_aishell(tree, tmp_path / "data")
    assert reports[-1].transcript_without_audio == 1


def test_aishell_unextracted_archives_say_how_to_extract(tmp_path):
    wav = tmp_path / "data_aishell" / "wav"
    wav.mkdir(parents=True)
    (wav / "S0002.tar.gz").write_bytes(b"")
    with pytest.raises(DataError, match="tar xzf"):
        corpora.prepare_aishell(tmp_path, tmp_path / "data")


def test_unknown_split_lists_the_splits_found(trees, tmp_path):
    result = run_cli("corpus-io", "prepare", "++corpus=aishell", f"++root={trees}", f"++output_dir={tmp_path}",
                     "++splits=[train,eval]")
    assert result.returncode == 2
    assert_user_error(result, "eval", "found: train, dev, test")


def test_prepare_requires_a_known_corpus(tmp_path):
    result = run_cli("corpus-io", "prepare", "++corpus=timit", f"++root={tmp_path}")
    assert result.returncode == 2
    assert_user_error(result, "corpus", "aishell, librispeech")


# --------------------------------------------------------------------------- LibriSpeech


def test_librispeech_subsets_become_sorted_kaldi_dirs(trees, tmp_path):
    reports = corpora.prepare_librispeech(trees, tmp_path / "data")
    assert [r.split for r in reports] == ["train_clean_100", "dev_clean", "test_clean"]
    train = check_kaldi_dir(tmp_path / "data" / "train_clean_100")
    # '103-...' sorts before '1034-...' (C locale): the reader-by-reader walk keeps global order
    assert list(train)[:3] == ["103-1240-0000", "103-1240-0001", "1034-1250-0000"]
    for report in reports:
        utts = check_kaldi_dir(tmp_path / "data" / report.split)
        assert report.utterances == 4 and report.speakers == 2 and report.no_transcript == 0
        for key, (path, text, spk) in utts.items():
            reader, chapter, _ = key.split("-")
            assert spk == f"{reader}-{chapter}" and path.endswith(f"/{reader}/{chapter}/{key}.flac")
            trans = dict(read(Path(path).parent / f"{spk}.trans.txt"))
            assert text == trans[key] and text == text.upper()


def test_librispeech_root_may_be_the_librispeech_dir(trees, tmp_path):
    reports = corpora.prepare_librispeech(trees / "LibriSpeech", tmp_path / "data", ["dev-clean"])
    assert [r.split for r in reports] == ["dev_clean"] and reports[0].utterances == 4


def test_librispeech_line_without_text_names_file_and_line(tree, tmp_path):
    trans = tree / "LibriSpeech" / "dev-clean" / "19" / "1241" / "19-1241.trans.txt"
    with open(trans, "a", encoding="utf-8") as f:
        f.write("19-1241-0002\n")
    result = run_cli("corpus-io", "prepare", "++corpus=librispeech", f"++root={tree}", f"++output_dir={tmp_path}")
    assert result.returncode == 2
    assert_user_error(result, f"{trans}:3", "19-1241-0002")


def test_librispeech_key_of_another_chapter_names_file_and_line(tree, tmp_path):
    trans = tree / "LibriSpeech" / "dev-clean" / "19" / "1241" / "19-1241.trans.txt"
    lines = trans.read_text(encoding="utf-8").splitlines()
    lines[1] = "19-9999-0001 " + lines[1].split(" ", 1)[1]
    trans.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{trans}:2: utterance '19-9999-0001' does not belong"):
        corpora.prepare_librispeech(tree, tmp_path / "data", ["dev-clean"])


def test_librispeech_flac_without_transcript_is_counted_and_left_out(tree, tmp_path):
    chapter = tree / "LibriSpeech" / "train-clean-100" / "1034" / "1250"
    shutil.copy(chapter / "1034-1250-0000.flac", chapter / "1034-1250-0007.flac")
    reports = corpora.prepare_librispeech(tree, tmp_path / "data", ["train-clean-100"])
    assert reports[0].utterances == 4 and reports[0].no_transcript == 1
    assert reports[0].no_transcript_examples == ["1034-1250-0007"]
    assert "1034-1250-0007" not in (tmp_path / "data" / "train_clean_100" / "text").read_text()


def test_librispeech_split_with_no_transcripts_at_all_is_an_error(tree, tmp_path):
    for trans in (tree / "LibriSpeech" / "dev-clean").glob("*/*/*.trans.txt"):
        trans.unlink()
    with pytest.raises(DataError, match="all 4 audio files lack a transcript"):
        corpora.prepare_librispeech(tree, tmp_path / "data", ["dev-clean"])
    assert not [p for p in (tmp_path / "data" / "dev_clean").iterdir()]  # no empty tables, no temp files


def test_a_failed_rerun_leaves_the_earlier_good_dir_as_it_was(tree, tmp_path):
    corpora.prepare_librispeech(tree, tmp_path / "data", ["dev-clean"])
    good = {p.name: p.read_bytes() for p in (tmp_path / "data" / "dev_clean").iterdir()}
    assert set(good) == {"wav.scp", "text", "utt2spk", "spk2utt"} and all(good.values())
    for trans in (tree / "LibriSpeech" / "dev-clean").glob("*/*/*.trans.txt"):
        trans.unlink()
    with pytest.raises(DataError, match="is empty.*Nothing was written"):
        corpora.prepare_librispeech(tree, tmp_path / "data", ["dev-clean"])
    assert {p.name: p.read_bytes() for p in (tmp_path / "data" / "dev_clean").iterdir()} == good


def test_prepared_dir_feeds_scp2jsonl(trees, tmp_path):
    result = run_cli("corpus-io", "prepare", "++corpus=librispeech", f"++root={trees}",
                     f"++output_dir={tmp_path}/data", "++splits=[test-clean]")
    assert result.returncode == 0, result.stderr
    d = tmp_path / "data" / "test_clean"
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{d}/wav.scp,{d}/text]",
                     f"++jsonl_file_out={d}/data.jsonl", "++num_workers=1")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (d / "data.jsonl").read_text().splitlines()]
    assert [x["key"] for x in lines] == [k for k, _ in read(d / "text")]
    assert all(x["source_len"] > 50 for x in lines)


def test_a_speaker_directory_whose_name_is_not_one_token_is_refused_and_no_split_is_written(tmp_path):
    """AISHELL's speaker is its directory's name, a field of utt2spk and spk2utt: 'S 0002' would split there."""
    base = tmp_path / "data_aishell"
    spk = base / "wav" / "train" / "S 0002"
    spk.mkdir(parents=True)
    sf.write(spk / "BAC009S0002W0121.wav", [0.0] * 1600, 16000)
    (base / "transcript").mkdir()
    aishell_transcript(tmp_path).write_text("BAC009S0002W0121 你好\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        corpora.prepare_aishell(tmp_path, tmp_path / "data")
    assert f"{spk}: speaker 'S 0002' is not one word" in str(err.value) and "rename the speaker" in str(err.value)
    assert not (tmp_path / "data" / "train" / "utt2spk").exists()
