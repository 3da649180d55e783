"""One set of inputs everywhere: FunASR, WeNet, Kaldi dir, NeMo and Lhotse manifests (corpus_io.tables.inputs),
read by pack-shards, make-datalist, make-tokenizer, stats and the raw loader; NeMo/Lhotse written back by
jsonl2scp ++output_format. Lhotse round trips use the real ``lhotse`` package (a [dev] dependency)."""

from __future__ import annotations

import gc
import gzip
import json
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

import lhotse  # noqa: F401 - a [dev] dependency: a broken install fails these tests, never skips them
import pytest
import soundfile as sf

from corpus_io.errors import DataError
from corpus_io.loader.dataset import build_dataloader
from corpus_io.loader.rawlist import RawList
from corpus_io.tables.inputs import detect, iter_records, nemo_key, open_input
from tests.conftest import assert_user_error, run_cli
from tests.loader_data import fixture_utts, small_conf, token_list

UTTS = fixture_utts()[:6]  # (key, path, text): real 8/16/44.1 kHz wav and flac


def lhotse_cuts(tmp_path: Path, *, segment: bool = False) -> tuple[Path, list]:
    """A CutSet written by lhotse itself (jsonl.gz); ``segment``: cuts of 0.2 s .. 0.9 s of each recording."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    recordings = RecordingSet.from_recordings(Recording.from_file(path, recording_id=key) for key, path, _ in UTTS)
    sups = SupervisionSet.from_segments(
        SupervisionSegment(id=f"{key}-s", recording_id=key, start=0.2 if segment else 0.0,
                           duration=0.7 if segment else recordings[key].duration, text=text, speaker=key[:4])
        for key, _, text in UTTS)
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=sups)
    if segment:
        cuts = cuts.trim_to_supervisions()
    path = tmp_path / "cuts.jsonl.gz"
    cuts.to_file(path)
    recordings.to_file(tmp_path / "demo_recordings_train.jsonl.gz")
    sups.to_file(tmp_path / "demo_supervisions_train.jsonl.gz")
    return path, list(cuts)


def shard_members(shard_dir: Path) -> dict[str, dict]:
    """key -> {txt, json} of every packed utterance."""
    found: dict[str, dict] = {}
    for shard in sorted(shard_dir.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                found.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return found


def test_a_cutset_written_by_lhotse_and_a_nemo_manifest_pack_to_shards_and_train(tmp_path):
    import corpus_io
    from tests.trained_models import run_train, torchrun_cmd

    cuts_path, cuts = lhotse_cuts(tmp_path)
    assert detect(str(cuts_path)) == "lhotse-cuts"
    # pack-shards and make-datalist in-process (the API runs the commands' code): the promise is the inputs
    corpus_io.pack_shards(cuts_path, tmp_path / "shards", num_utts_per_shard=4, num_workers=1)
    members = shard_members(tmp_path / "shards")
    assert sorted(members) == sorted(c.id for c in cuts)
    for cut in cuts:
        assert members[cut.id]["txt"].decode() == cut.supervisions[0].text
        assert json.loads(members[cut.id]["json"])["speaker"] == cut.supervisions[0].speaker
    # a NeMo manifest of six other utterances, packed and merged into the same training list
    nemo = tmp_path / "nemo.json"
    nemo.write_text("".join(json.dumps({"audio_filepath": path, "duration": sf.info(path).duration, "text": text})
                            + "\n" for _, path, text in fixture_utts()[6:12]))
    corpus_io.pack_shards(nemo, tmp_path / "nemo_shards", num_utts_per_shard=4, num_workers=1)
    merged = tmp_path / "train.list"
    corpus_io.make_datalist([str(tmp_path / "shards"), str(tmp_path / "nemo_shards")], merged, data_type="shard")
    tokens = token_list(tmp_path).token_list
    cmd = torchrun_cmd(tmp_path / "exp", {"shards": merged, "tokens": tokens},
                       "++train_conf.max_epoch=1", "++model.num_blocks=1", "++dataset_conf.batch_size=4", nproc=1)
    trained = run_train(cmd[cmd.index("--no-python") + 1:])  # corpus-io train as one process: no launcher
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    assert list((tmp_path / "exp").glob("*.pt")), "training wrote no checkpoint"
    assert "12 utts" in trained.stdout + trained.stderr  # both corpora were trained on


def test_segment_cuts_and_the_recording_supervision_pair_give_the_same_segments(tmp_path):
    cuts_path, cuts = lhotse_cuts(tmp_path, segment=True)
    from_cuts = {r["key"]: r for r in iter_records(cuts_path)}
    assert sorted(from_cuts) == sorted(c.id for c in cuts)
    for cut in cuts:
        rec = from_cuts[cut.id]
        assert (rec["start"], rec["end"]) == pytest.approx((0.2, 0.9))
        assert rec["target"] == cut.supervisions[0].text and rec["speaker"] == cut.supervisions[0].speaker
    # the pair, given as either file or as their directory: one utterance per supervision, same span and text
    for given in ("demo_supervisions_train.jsonl.gz", "demo_recordings_train.jsonl.gz", "."):
        pair = {r["key"]: r for r in iter_records(tmp_path / given)}
        assert sorted(pair) == sorted(from_cuts)
        for key, rec in pair.items():
            assert (rec["source"], rec["start"], rec["end"], rec["target"]) == pytest.approx(
                (from_cuts[key]["source"], 0.2, 0.9, from_cuts[key]["target"]))
    # make-datalist turns the pair into a raw list whose durations are the segments' own
    out = tmp_path / "raw.list"
    result = run_cli("corpus-io", "make-datalist", "++data_type=raw", f"++input=[{tmp_path}]", f"++output={out}")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert {x["duration"] for x in lines} == {0.7} and all(x["source_len"] == 70 for x in lines)


def nemo_manifest(tmp_path: Path) -> Path:
    """NeMo lines: a relative audio_filepath (beside the manifest), a whole file, two segments of one file."""
    audio_dir = tmp_path / "audio"
    audio_dir.mkdir()
    lines = []
    for _key, path, text in UTTS[:3]:
        local = audio_dir / Path(path).name
        local.write_bytes(Path(path).read_bytes())
        lines.append({"audio_filepath": f"audio/{local.name}", "duration": round(sf.info(local).duration, 2),
                      "text": text})
    key, path, text = UTTS[3]
    lines.append({"audio_filepath": path, "duration": 0.5, "text": "first half", "offset": 0.0})
    lines.append({"audio_filename": path, "duration": 0.4, "normalized_text": "second half", "offset": 0.5,
                  "lang": "en"})  # NeMo's aliases
    manifest = tmp_path / "train_manifest.json"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return manifest


def test_a_nemo_manifest_gets_keys_by_the_documented_rule_and_its_segments(tmp_path):
    manifest = nemo_manifest(tmp_path)
    assert detect(str(manifest)) == "nemo"
    records = list(iter_records(manifest))
    stems = [Path(p).stem for _, p, _ in UTTS[:4]]
    assert [r["key"] for r in records] == stems[:3] + [stems[3], f"{stems[3]}-0000500"]
    assert Path(records[0]["source"]) == tmp_path / "audio" / Path(UTTS[0][1]).name  # NeMo: beside the manifest
    assert "start" not in records[0]  # no offset: the whole file, duration kept as metadata
    assert (records[3]["start"], records[3]["end"]) == (0.0, 0.5)
    assert (records[4]["start"], records[4]["end"], records[4]["lang"]) == (0.5, 0.9, "en")
    result = run_cli("corpus-io", "pack-shards", f"++input={manifest}", f"++output_dir={tmp_path}/shards",
                     "++num_workers=1")
    assert result.returncode == 0, result.stderr
    members = shard_members(tmp_path / "shards")
    segment = json.loads(members[f"{stems[3]}-0000500"]["json"])
    assert segment["duration"] == pytest.approx(0.4, abs=1e-3)
    assert members[f"{stems[3]}-0000500"]["txt"] == b"second half"


def test_nemo_key_rule():
    assert nemo_key("/data/LibriSpeech/103/1240/103-1240-0000.flac") == "103-1240-0000"
    assert nemo_key("a b/c d.wav", 12.5) == "c_d-0012500"
    assert nemo_key("x.wav", 0.0) == "x"


@pytest.mark.parametrize("kind, files", [
    ("lhotse-shar", ["cuts.000000.jsonl.gz", "recording.000000.tar"]),
    ("kaldi", ["wav.scp", "text", "split2/wav.scp"]),
    ("lhotse-recordings+supervisions", ["recordings.jsonl.gz", "supervisions.jsonl.gz"]),
])
def test_detect_lists_a_local_directory_once_for_all_its_checks(tmp_path, monkeypatch, kind, files):
    # parquet, Shar, Kaldi and Lhotse-pair checks share one listing (a directory on a network filesystem is slow)
    d = tmp_path / "input"
    for name in files:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(b"")
    cut = {"id": "c", "recording": {"id": "r", "sources": [{"type": "shar", "channels": [0], "source": ""}]}}
    if kind == "lhotse-shar":  # a cut whose audio is in the Shar tar: what tells a Shar from a plain CutSet
        (d / files[0]).write_bytes(gzip.compress(json.dumps(cut).encode() + b"\n"))
    listed: list[str] = []
    for name in ("scandir", "listdir"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda p=".", real=real: listed.append(os.path.abspath(p)) or real(p))
    assert detect(str(d)) == kind
    assert listed.count(str(d)) == 1, listed


@pytest.mark.parametrize("case, needles", [
    ("multichannel", ["channel(s) 1 of the 2-channel recording", "Split the channels"]),
    ("overlap", ["overlap", "trim_to_supervisions"]),
    ("tarred", ["tarred NeMo dataset", "shard_id 0", "audio_0.tar is not there"]),
    ("nemo_repeat", ["duplicate key", "add a 'key' field"]),
])
def test_inputs_corpus_io_cannot_take_are_refused_with_the_way_out(tmp_path, case, needles):
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    stereo = tmp_path / "stereo.wav"
    subprocess.run(["sox", "-n", "-r", "16000", "-b", "16", "-c", "2", str(stereo), "synth", "1.0", "sine", "300"],
                   check=True)
    rec = Recording.from_file(stereo)
    path = tmp_path / "in.jsonl"
    if case == "multichannel":
        sup = SupervisionSegment(id="s", recording_id=rec.id, start=0, duration=1.0, channel=1, text="a")
        CutSet.from_cuts([MonoCut(id="c", start=0, duration=1.0, channel=1, recording=rec, supervisions=[sup])]
                         ).to_file(path)
    elif case == "overlap":
        mono = Recording.from_file(UTTS[0][1])
        sups = [SupervisionSegment(id=f"s{i}", recording_id=mono.id, start=0.1 * i, duration=0.5, text="a")
                for i in range(2)]
        CutSet.from_cuts([MonoCut(id="c", start=0, duration=mono.duration, channel=0, recording=mono,
                                  supervisions=sups)]).to_file(path)
    elif case == "tarred":
        path.write_text(json.dumps({"audio_filepath": "audio_1.wav", "duration": 1.0, "text": "a", "shard_id": 0})
                        + "\n")
    else:
        path.write_text("".join(json.dumps({"audio_filepath": f"{d}/same.wav", "duration": 1.0, "text": "a"}) + "\n"
                                for d in ("a", "b")))
    result = run_cli("corpus-io", "pack-shards", f"++input={path}", f"++output_dir={tmp_path}/shards")
    assert_user_error(result, f"{path}", *needles)


def test_a_multichannel_cut_of_every_channel_is_read_mixed_down(tmp_path):
    from lhotse import CutSet, MultiCut, Recording, SupervisionSegment

    stereo = tmp_path / "stereo.wav"
    subprocess.run(["sox", "-n", "-r", "16000", "-b", "16", "-c", "2", str(stereo), "synth", "1.0", "sine", "300"],
                   check=True)
    rec = Recording.from_file(stereo)
    sup = SupervisionSegment(id="s", recording_id=rec.id, start=0, duration=1.0, channel=[0, 1], text="a")
    CutSet.from_cuts([MultiCut(id="c", start=0, duration=1.0, channel=[0, 1], recording=rec, supervisions=[sup])]
                     ).to_file(tmp_path / "c.jsonl")
    (rec_,) = iter_records(tmp_path / "c.jsonl")
    assert rec_["source"] == str(stereo) and "start" not in rec_


def test_make_tokenizer_stats_and_the_raw_loader_read_the_other_kinds(tmp_path, fixture_corpus):
    # make-tokenizer: a Kaldi data dir (it used to say "Is a directory") and a Lhotse CutSet
    import corpus_io

    cuts_path, cuts = lhotse_cuts(tmp_path)
    for given in (fixture_corpus, cuts_path):  # in-process: the API runs the command's code
        out = tmp_path / f"tokens-{Path(given).name}.txt"
        corpus_io.make_tokenizer(given, out)
        assert "<blank>" in out.read_text()
    # stats, raw: the gzipped CutSet and a Kaldi dir
    for given, count in ((cuts_path, len(cuts)), (fixture_corpus, 24)):
        result = run_cli("corpus-io", "stats", f"++input={given}", "++data_type=raw", f"++output={tmp_path}/s.png")
        assert result.returncode == 0, result.stderr
        assert re.search(rf"^utterances +{count}$", result.stdout, re.M), result.stdout
    # the raw loader: a NeMo manifest and an uncompressed CutSet are read line by line, a gzipped one through
    # its one-pass temporary jsonl
    (tmp_path / "n").mkdir()
    nemo = nemo_manifest(tmp_path / "n")
    assert RawList(nemo).record(4)["start"] == 0.5
    plain = tmp_path / "cuts.jsonl"
    plain.write_bytes(gzip.decompress(cuts_path.read_bytes()))
    assert RawList(plain).record(0)["key"] == cuts[0].id == RawList(cuts_path).record(0)["key"]
    assert RawList(plain).lines == str(plain) and RawList(cuts_path).lines != str(cuts_path)


def test_exported_cutset_loads_in_lhotse_and_reads_back_the_same(tmp_path, fixture_corpus):
    from lhotse import CutSet

    nemo = nemo_manifest(tmp_path)
    out = tmp_path / "out_cuts.jsonl.gz"
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={nemo}", "++output_format=lhotse",
                     f"++manifest_out={out}")
    assert result.returncode == 0, result.stderr
    cuts = CutSet.from_file(out).to_eager()
    ours = list(iter_records(nemo))
    assert [c.id for c in cuts] == [r["key"] for r in ours]
    for cut, rec in zip(cuts, ours):
        assert cut.supervisions[0].text == rec["target"]
        samples = cut.load_audio()  # lhotse decodes the span we wrote
        expected = (rec["end"] - rec["start"]) if "start" in rec else sf.info(rec["source"]).duration
        assert samples.shape[-1] == pytest.approx(expected * cut.sampling_rate, abs=2)
    back = list(iter_records(out))
    assert [(r["key"], r["target"], r.get("start")) for r in back] == \
        [(r["key"], r["target"], r.get("start")) for r in ours]


def test_nemo_export_has_the_documented_fields_and_reads_back(tmp_path, fixture_corpus):
    out = tmp_path / "manifest.json"
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={fixture_corpus / 'segments_dir'}",
                     "++output_format=nemo", f"++manifest_out={out}")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    # NeMo's manifest parser (nemo.collections.common.parts.preprocessing.manifest.__parse_item) reads
    # audio_filepath, duration (s, required), text, offset, speaker, lang; nothing else need be there
    for line in lines:
        assert {"audio_filepath", "duration", "text", "offset"} <= set(line)
        assert set(line) <= {"audio_filepath", "duration", "text", "offset", "speaker", "lang", "key"}
        assert isinstance(line["duration"], float) and line["duration"] > 0
    assert lines[1]["offset"] == 3.205 and lines[1]["duration"] == pytest.approx(5.178 - 3.205)
    back = list(iter_records(out))
    original = list(open_input(str(fixture_corpus / "segments_dir")).records())
    assert [r["key"] for r in back] == [r["key"] for r in original]  # keys kept (they differ from the rule)
    assert [r["target"] for r in back] == [r["target"] for r in original]


def test_a_tarred_nemo_dataset_reads_its_members_from_the_tars_beside_the_manifest(tmp_path):
    """NeMo's convert_to_tarred_audio_dataset layout: audio_<shard_id>.tar of basenames + a manifest naming them."""
    lines = []
    for i, (_, path, text) in enumerate(UTTS[:4]):
        shard = i % 2
        with tarfile.open(tmp_path / f"audio_{shard}.tar", "a") as tar:
            tar.add(path, arcname=Path(path).name)
        lines.append({"audio_filepath": Path(path).name, "duration": sf.info(path).duration, "text": text,
                      "shard_id": shard})
    manifest = tmp_path / "tarred_audio_manifest.json"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = run_cli("corpus-io", "pack-shards", f"++input={manifest}", f"++output_dir={tmp_path}/shards",
                     "++num_workers=1")
    assert result.returncode == 0, result.stderr
    members = shard_members(tmp_path / "shards")
    for _, path, text in UTTS[:4]:
        key, ext = Path(path).stem, Path(path).suffix[1:]
        assert members[key][ext] == Path(path).read_bytes() and members[key]["txt"].decode() == text
    sample = RawList(manifest).sample(1)  # the raw loader reads the member too
    assert sample["audio"] == Path(UTTS[1][1]).read_bytes() and sample["audio_format"] == Path(UTTS[1][1]).suffix[1:]
    # and the NeMo export writes the tarred layout back: member names and shard ids
    out = tmp_path / "again.json"
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={manifest}", "++output_format=nemo",
                     f"++manifest_out={out}")
    assert result.returncode == 0, result.stderr
    again = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["audio_filepath"], x["shard_id"], x["text"]) for x in again] == \
        [(x["audio_filepath"], x["shard_id"], x["text"]) for x in lines]


def test_a_cut_with_several_supervisions_in_turn_is_one_utterance_with_their_texts_in_time_order(tmp_path):
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    mono = Recording.from_file(UTTS[0][1])
    sups = [SupervisionSegment(id="b", recording_id=mono.id, start=0.6, duration=0.3, text="world"),
            SupervisionSegment(id="a", recording_id=mono.id, start=0.1, duration=0.4, text="hello")]
    CutSet.from_cuts([MonoCut(id="c", start=0, duration=mono.duration, channel=0, recording=mono,
                              supervisions=sups)]).to_file(tmp_path / "c.jsonl")
    (rec,) = iter_records(tmp_path / "c.jsonl")
    assert rec["target"] == "hello world" and "start" not in rec


def test_the_raw_loader_trains_on_a_nemo_manifest_as_it_is(tmp_path):
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.tokenizer import build_tokenizer
    from tests.loader_data import small_conf

    manifest = nemo_manifest(tmp_path)
    tok = build_tokenizer(token_list(tmp_path))
    loader = build_dataloader(str(manifest), small_conf(data_type="raw", shuffle=False, sort=False, num_workers=1),
                              tok, train=False, rank=0, world_size=1)
    frames = {k: int(n) for batch in loader for k, n in zip(batch["keys"], batch["feats_lengths"])}
    stem = Path(UTTS[3][1]).stem
    assert sorted(frames) == sorted(r["key"] for r in iter_records(manifest))
    assert frames[f"{stem}-0000500"] == pytest.approx(38, abs=2)  # 0.4 s of 25 ms windows every 10 ms


def test_compute_cmvn_reads_a_nemo_manifest_and_a_kaldi_dir(tmp_path, fixture_corpus):
    import corpus_io

    frames, before = {}, sorted(os.listdir(fixture_corpus))
    for name, manifest in (("nemo", nemo_manifest(tmp_path)), ("kaldi", fixture_corpus)):
        out = tmp_path / f"{name}.cmvn.json"  # in-process (the API runs the command's code): the promise is the input
        corpus_io.compute_cmvn(manifest, out, dataset_conf={"data_type": "raw", "num_workers": 2})
        frames[name] = json.loads(out.read_text())["frame_num"]
    assert frames["nemo"] > 0 and frames["kaldi"] > 0
    assert sorted(os.listdir(fixture_corpus)) == before  # nothing written beside the Kaldi dir


def test_a_bad_entry_of_a_kaldi_dir_read_by_the_raw_loader_is_named_by_its_line_in_the_dir(tmp_path):
    utts = fixture_utts()
    (tmp_path / "wav.scp").write_text("".join(f"{k} {'/missing/x.wav' if i == 4 else p}\n"
                                              for i, (k, p, _) in enumerate(utts)))
    (tmp_path / "text").write_text("".join(f"{k} {t}\n" for k, _, t in utts), encoding="utf-8")
    loader = build_dataloader(str(tmp_path), small_conf(data_type="raw", num_workers=0, feats_type="raw",
                                                        shuffle=False), None, train=False, rank=0, world_size=1)
    loader.set_epoch(0)
    with pytest.raises(DataError, match=rf"{re.escape(str(tmp_path / 'wav.scp'))}:5: key '{utts[4][0]}'") as err:
        list(loader)
    assert "corpus-io-raw" not in str(err.value)  # never the temporary jsonl


def test_the_raw_loader_reads_a_kaldi_dir_and_a_gzipped_cutset_with_each_key_once_over_workers(tmp_path,
                                                                                               fixture_corpus,
                                                                                               monkeypatch):
    before = sorted(os.listdir(fixture_corpus))
    cuts_path, cuts = lhotse_cuts(tmp_path)
    assert str(cuts_path).endswith(".gz")
    for manifest, keys in ((fixture_corpus, [r["key"] for r in iter_records(fixture_corpus)]),
                           (cuts_path, [c.id for c in cuts])):
        raw = RawList(manifest)
        converted = raw.lines
        loader = build_dataloader(str(manifest), small_conf(data_type="raw", num_workers=2, feats_type="raw"), None,
                                  train=False, rank=0, world_size=1)
        for epoch in range(2):  # the workers of a second epoch still find the converted list
            loader.set_epoch(epoch)
            assert sorted(k for batch in loader for k in batch["keys"]) == sorted(keys)
        del raw
        gc.collect()
        assert not os.path.exists(converted)  # the temporary jsonl goes with its list
    assert sorted(os.listdir(fixture_corpus)) == before  # nothing written beside the input
    (tmp_path / "bad").mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with pytest.raises(DataError, match="bad"):
        RawList(tmp_path / "bad")
    assert not os.listdir(tmp_path / "tmp")  # a conversion that fails leaves no temporary jsonl


def test_make_datalist_takes_a_kaldi_dir_with_segments(tmp_path, fixture_corpus):
    out = tmp_path / "raw.list"
    result = run_cli("corpus-io", "make-datalist", "++data_type=raw", f"++input=[{fixture_corpus / 'segments_dir'}]",
                     f"++output={out}")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["key"] for x in lines] == [f"long-seg{i:02d}" for i in range(4)]
    assert lines[1]["duration"] == pytest.approx(5.178 - 3.205, abs=1e-3) and lines[1]["speaker"] == "long"


def _lhotse_lines(tmp_path: Path, case: str) -> Path:
    """Two cuts (or a recording + supervision pair) written by lhotse, the second edited as ``case`` says."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    recordings = [Recording.from_file(path, recording_id=key) for key, path, _ in UTTS[:2]]
    sups = [SupervisionSegment(id=f"{r.id}-s", recording_id=r.id, start=0.0, duration=r.duration, text="hi")
            for r in recordings]
    if case == "pair supervision start -2.0":
        RecordingSet.from_recordings(recordings).to_file(tmp_path / "demo_recordings.jsonl")
        lines = [s.to_dict() for s in sups]
        lines[1]["start"] = -2.0
        path = tmp_path / "demo_supervisions.jsonl"
    else:
        cuts = CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings),
                                     supervisions=SupervisionSet.from_segments(sups))
        lines = [dict(c.to_dict(), id=f"c{i}") for i, c in enumerate(cuts, 1)]
        if case == "cut start -2.0":
            lines[1]["start"] = -2.0  # its duration stays the recording's: read as the whole file before
        else:  # "supervision of another recording"
            lines[1]["supervisions"][0]["recording_id"] = UTTS[0][0]
        path = tmp_path / "cuts.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("case, needles", [
    ("cut start -2.0", ["cuts.jsonl:2", "cut 'c2' (start -2 s", "lies outside its recording", "Fix the cut in Lhotse"]),
    ("supervision of another recording", ["cuts.jsonl:2", f"cut 'c2' is of recording '{UTTS[1][0]}'",
                                          f"supervision '{UTTS[1][0]}-s' is of recording '{UTTS[0][0]}'"]),
    ("pair supervision start -2.0", ["demo_supervisions.jsonl:2", f"supervision '{UTTS[1][0]}-s' (start -2 s",
                                     "lies outside its recording"]),
])
def test_a_lhotse_cut_or_supervision_outside_its_recording_is_refused_as_a_kaldi_segment_is(tmp_path, case, needles):
    """Checked where every reader takes them (corpus_io.tables.inputs), as Kaldi segments are: 0 <= start < end, inside
    the
    recording; a cut's supervisions are of its recording. make-datalist then writes nothing."""
    from corpus_io.api import make_datalist

    given, out = tmp_path / "in", tmp_path / "out"
    given.mkdir()
    path = _lhotse_lines(given, case)
    before = sorted(p.name for p in given.iterdir())
    with pytest.raises(DataError) as error:
        make_datalist([str(path)], out / "raw.list", data_type="raw")
    for needle in needles:
        assert needle in str(error.value), str(error.value)
    assert list(out.iterdir()) == [] and sorted(p.name for p in given.iterdir()) == before
    with pytest.raises(DataError, match="lies outside|is of recording"):
        list(iter_records(path))  # every reader: the check is the input's


@pytest.mark.parametrize("command", ["make-datalist", "make-tokenizer", "jsonl2scp"])
def test_a_nemo_manifest_whose_only_line_has_text_null_is_reported_as_that_line_not_as_an_empty_file(tmp_path,
                                                                                                     command):
    from corpus_io import api

    given, out = tmp_path / "in", tmp_path / "out"
    given.mkdir()
    manifest = given / "train_manifest.json"
    manifest.write_text(json.dumps({"audio_filepath": UTTS[0][1], "duration": 3.1, "text": None}) + "\n")
    run = {"make-datalist": lambda: api.make_datalist([str(manifest)], out / "raw.list", data_type="raw"),
           "make-tokenizer": lambda: api.make_tokenizer(manifest, out / "tokens.txt"),
           "jsonl2scp": lambda: api.jsonl2scp(manifest, [], output_format="nemo",
                                              manifest_out=str(out / "manifest.json"))}[command]
    out.mkdir()
    with pytest.raises(DataError) as error:
        run()
    message = str(error.value)
    assert f"{manifest}: its only utterance was skipped" in message
    assert f"{manifest}:1: key '{Path(UTTS[0][1]).stem}': missing transcript ('text' is null" in message
    assert "empty file" not in message
    assert list(out.iterdir()) == [] and [p.name for p in given.iterdir()] == [manifest.name]


def _one_token_cases(tmp_path: Path) -> list[tuple[str, Path, str]]:
    """``(kind, input, where the message must point)`` of three inputs whose second utterance's key is two words."""
    from lhotse import CutSet, Recording, SupervisionSegment

    (k1, p1, t1), (k2, p2, t2) = fixture_utts()[:2]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text(json.dumps({"key": k1, "source": p1, "target": t1}) + "\n" +
                     json.dumps({"key": "utt 2", "source": p2, "target": t2}) + "\n", encoding="utf-8")
    cuts = []
    for key, path, text in ((k1, p1, t1), ("cut\t2", p2, t2)):
        rec = Recording.from_file(path, recording_id=key.replace("\t", "_"))
        cut = rec.to_cut()
        cut.id = key
        cut.supervisions = [SupervisionSegment(id=key, recording_id=rec.id, start=0.0, duration=rec.duration,
                                               text=text)]
        cuts.append(cut)
    CutSet.from_cuts(cuts).to_file(str(tmp_path / "cuts.jsonl.gz"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": [k1, "row\x012"], "audio": [{"bytes": Path(p).read_bytes(), "path": Path(p).name}
                                                       for p in (p1, p2)], "text": [t1, t2]})
    (tmp_path / "pq").mkdir()
    pq.write_table(table, tmp_path / "pq" / "train-00000-of-00001.parquet")
    return [("funasr", jsonl, f"{jsonl}:2: key 'utt 2' is not one word: it holds whitespace (U+0020)"),
            ("lhotse", tmp_path / "cuts.jsonl.gz", "cuts.jsonl.gz:2: key 'cut\\t2' is not one word"),
            ("parquet", tmp_path / "pq", "train-00000-of-00001.parquet row 1: key 'row\\x012' is not one word: it "
                                         "holds a control character (U+0001)")]


def test_a_key_that_is_not_one_token_is_refused_by_the_first_reader_and_nothing_is_packed_or_exported(tmp_path):
    for kind, input_, says in _one_token_cases(tmp_path):
        before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
        for command, output in (("pack-shards", "shards"), ("export", "hf")):
            result = run_cli("corpus-io", command, f"++input={input_}", f"++output_dir={tmp_path / output}",
                             "++num_workers=1")
            assert_user_error(result, says, "A key is one token")
            assert not (tmp_path / output).exists(), (kind, command)
        assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def test_a_kaldi_dirs_speaker_that_is_not_one_token_is_refused_naming_its_utt2spk_line(tmp_path):
    """An utt2spk line ``utt spk 1`` holds two words for one speaker: read as the speaker 'spk 1', every table
    written from it (segment's utt2spk, a spk2utt) would be broken; refused as a key is, naming the line."""
    utts = fixture_utts()[:3]
    (tmp_path / "wav.scp").write_text("".join(f"{k} {p}\n" for k, p, _ in utts))
    (tmp_path / "text").write_text("".join(f"{k} {t}\n" for k, _, t in utts), encoding="utf-8")
    (tmp_path / "utt2spk").write_text(f"{utts[0][0]} spk1\n{utts[1][0]} spk 1\n{utts[2][0]} spk1\n")
    with pytest.raises(DataError) as err:
        list(iter_records(str(tmp_path)))
    assert f"{tmp_path / 'utt2spk'}:2: key '{utts[1][0]}': speaker 'spk 1' is not one word" in str(err.value)
    assert "A speaker id is one token" in str(err.value)
