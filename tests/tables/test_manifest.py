"""scp2jsonl / jsonl2scp: FunASR's interface and field semantics, strict about bad input."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest
import soundfile as sf

from tests.conftest import assert_user_error, run_cli


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def funasr_scp2jsonl(wav_scp, text, out, *extra: str):
    return run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[\"{wav_scp}\",\"{text}\"]",
                   "++data_type_list=[\"source\",\"target\"]", f"++jsonl_file_out={out}", *extra)


def funasr_source_len(num_samples: int, rate: int) -> int:
    """FunASR's rule: resampling to 16 kHz gives ceil(n * 16000 / sr) samples, then // 160."""
    return -(-num_samples * 16000 // rate) // 160


def expected_source_len(path: str) -> int:
    """Ground truth by full decode (what FunASR does), then FunASR's rule."""
    wave, rate = sf.read(path)
    return funasr_source_len(len(wave), rate)


def test_funasr_command_line_matches_funasr_lengths(tmp_path, fixture_corpus):
    out = tmp_path / "train.jsonl"
    result = funasr_scp2jsonl(fixture_corpus / "wav.scp", fixture_corpus / "text", out)
    assert result.returncode == 0, result.stderr
    assert "24 utterances" in result.stderr and "skipped 0" in result.stderr
    records = read_jsonl(out)
    wav_keys = [line.split()[0] for line in (fixture_corpus / "wav.scp").read_text().splitlines()]
    assert [r["key"] for r in records] == wav_keys  # order of the first file
    rates, formats = set(), set()
    for r in records:
        assert list(r) == ["key", "source", "source_len", "target", "target_len"]
        assert r["source_len"] == expected_source_len(r["source"]), r
        text = r["target"]
        assert r["target_len"] == (len(text.split()) if " " in text else len(text))
        rates.add(sf.info(r["source"]).samplerate)
        formats.add(Path(r["source"]).suffix)
    assert rates == {8000, 16000, 44100} and formats == {".wav", ".flac"}


def test_extra_fields_get_their_own_len(tmp_path, fixture_corpus):
    out = tmp_path / "x.jsonl"
    result = run_cli("corpus-io", "scp2jsonl",
                     f"++scp_file_list=[{fixture_corpus}/wav.scp,{fixture_corpus}/text,{fixture_corpus}/utt2spk]",
                     "++data_type_list=[source,target,speaker]", f"++jsonl_file_out={out}", "++num_workers=1")
    assert result.returncode == 0, result.stderr
    first = read_jsonl(out)[0]
    assert first["speaker"] == "spk0" and first["speaker_len"] == 4


def test_segments_give_lengths_from_start_and_end(tmp_path, fixture_corpus):
    seg = fixture_corpus / "segments_dir"
    out = tmp_path / "seg.jsonl"
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{seg}/wav.scp,{seg}/text]",
                     "++data_type_list=[source,target]", f"++segments={seg}/segments", f"++jsonl_file_out={out}")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert [r["key"] for r in records] == [f"long-seg{i:02d}" for i in range(4)]
    total = sf.info(records[0]["source"]).frames
    for r in records:
        first = round(r["start"] * 16000)
        last = total if r["end"] < 0 else round(r["end"] * 16000)
        assert r["source_len"] == (last - first) * 100 // 16000
    assert records[1]["target"] == "speech recognition is fun"
    assert {r["recording"] for r in records} == {"long"}


def test_segments_lines_carry_their_recording_id_to_the_loader_when_it_is_not_the_file_name(tmp_path, fixture_corpus):
    """A recording id is the segments file's, not the audio file's name: scp2jsonl writes it as ``recording`` and
    the raw loader gives it to decode's CTM (without the field, the file name was the only guess)."""
    from corpus_io.config import DecodeConfig
    from corpus_io.loader.dataset import build_dataloader

    seg = fixture_corpus / "segments_dir"
    (tmp_path / "wav.scp").write_text(f"rec-7 {seg / 'wav' / 'long.wav'}\n")
    (tmp_path / "segments").write_text((seg / "segments").read_text().replace(" long ", " rec-7 "))
    out = tmp_path / "seg.jsonl"
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{tmp_path}/wav.scp,{seg}/text]",
                     "++data_type_list=[source,target]", f"++segments={tmp_path}/segments", f"++jsonl_file_out={out}")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert len(records) == 4 and {r["recording"] for r in records} == {"rec-7"}
    conf = DecodeConfig().dataset_conf
    conf.data_type, conf.num_workers = "raw", 0
    named = {s[0] for batch in build_dataloader(str(out), conf, None, train=False, rank=0, world_size=1)
             for s in batch["segments"]}
    assert named == {"rec-7"}  # decode's CTM lines name it


def test_a_recording_id_that_is_not_one_token_is_refused_by_the_first_reader_naming_file_and_line(
        tmp_path, fixture_corpus):
    """A list line's ``recording`` ("rec A", or with a line break) would split decode's CTM lines: the raw loader
    (and every reader of the list) refuses it naming the file and line, as a key; a segments file's recording with
    a control character is refused by scp2jsonl; the CTM writer never writes a line of other than six fields."""
    from corpus_io.config import DecodeConfig
    from corpus_io.errors import DataError
    from corpus_io.loader.dataset import build_dataloader

    seg = fixture_corpus / "segments_dir"
    wav = str(seg / "wav" / "long.wav")
    conf = DecodeConfig().dataset_conf
    conf.data_type, conf.num_workers = "raw", 0
    for bad, shown in (("rec A", "'rec A'"), ("rec\nA", "'rec\\nA'")):
        raw = tmp_path / "seg.jsonl"
        raw.write_text(json.dumps({"key": "seg1", "wav": wav, "txt": "x", "start": 0.0, "end": 1.0,
                                   "recording": "long"}) + "\n" +
                       json.dumps({"key": "seg2", "wav": wav, "txt": "x", "start": 1.0, "end": 2.0,
                                   "recording": bad}) + "\n", encoding="utf-8")
        with pytest.raises(DataError) as err:
            list(build_dataloader(str(raw), conf, None, train=False, rank=0, world_size=1))
        message = str(err.value)
        assert f"{raw}:2" in message and f"recording id {shown} is not one word" in message, message
        assert "A recording id is one token" in message
    (tmp_path / "wav.scp").write_text(f"long {wav}\n")
    (tmp_path / "segments").write_text((seg / "segments").read_text().replace(" long ", " lo\x01ng ", 1))
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{tmp_path}/wav.scp,{seg}/text]",
                     "++data_type_list=[source,target]", f"++segments={tmp_path}/segments",
                     f"++jsonl_file_out={tmp_path / 'out.jsonl'}")
    assert_user_error(result, f"{tmp_path}/segments:1", "recording id 'lo\\x01ng' is not one word")
    assert not (tmp_path / "out.jsonl").exists()
    from corpus_io.infer.decode import ctm_line

    assert ctm_line("u1", "long", 1.0, 0.5, "word", 0.9) == "long 1 1.00 0.50 word 0.90\n"
    for recording, word in (("rec A", "word"), ("long", "two words"), ("long", "")):
        with pytest.raises(DataError, match="u1"):
            ctm_line("u1", recording, 1.0, 0.5, word, 0.9)


def make_tables(tmp_path, fixture_corpus, n_text: int):
    wav_lines = (fixture_corpus / "wav.scp").read_text().splitlines()
    text_lines = (fixture_corpus / "text").read_text().splitlines()
    (tmp_path / "wav.scp").write_text("\n".join(wav_lines) + "\n")
    (tmp_path / "text").write_text("\n".join(text_lines[:n_text]) + "\n")
    return tmp_path / "wav.scp", tmp_path / "text"


def test_missing_keys_error_names_ten_and_counts_all(tmp_path, fixture_corpus):
    wav, text = make_tables(tmp_path, fixture_corpus, n_text=2)
    out = tmp_path / "o.jsonl"
    result = funasr_scp2jsonl(wav, text, out)
    assert_user_error(result, "22 key(s)", "(and 12 more)", "++on_error=skip")
    assert not out.exists() and not list(tmp_path.glob(".o.jsonl*"))


def test_missing_keys_skip_reports_counts(tmp_path, fixture_corpus):
    wav, text = make_tables(tmp_path, fixture_corpus, n_text=5)
    out = tmp_path / "o.jsonl"
    result = funasr_scp2jsonl(wav, text, out, "++on_error=skip")
    assert result.returncode == 0, result.stderr
    assert len(read_jsonl(out)) == 5
    assert "skipped 19 (missing in text: 19)" in result.stderr


def test_key_only_in_text_is_reported(tmp_path, fixture_corpus):
    wav, text = make_tables(tmp_path, fixture_corpus, n_text=24)
    with open(text, "a") as f:
        f.write("ghost-utt hello\n")
    result = funasr_scp2jsonl(wav, text, tmp_path / "o.jsonl")
    assert_user_error(result, "ghost-utt", "are only in")


def test_corrupt_audio_errors_by_key_or_is_skipped_and_counted(tmp_path, fixture_corpus):
    wav, text = make_tables(tmp_path, fixture_corpus, n_text=24)
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF not really a wav file")
    lines = wav.read_text().splitlines()
    key = lines[3].split()[0]
    lines[3] = f"{key} {bad}"
    wav.write_text("\n".join(lines) + "\n")
    result = funasr_scp2jsonl(wav, text, tmp_path / "o.jsonl")
    assert_user_error(result, key, "wav.scp:4", "not a readable audio file")
    result = funasr_scp2jsonl(wav, text, tmp_path / "o.jsonl", "++on_error=skip")
    assert result.returncode == 0 and "unreadable audio: 1" in result.stderr


def test_duplicate_key_via_cli_gives_both_lines(tmp_path, fixture_corpus):
    wav, text = make_tables(tmp_path, fixture_corpus, n_text=24)
    first = wav.read_text().splitlines()[0]
    with open(wav, "a") as f:
        f.write("\n" + first + "\n")
    result = funasr_scp2jsonl(wav, text, tmp_path / "o.jsonl")
    assert_user_error(result, "duplicate key", "wav.scp:1", "wav.scp:26")


def test_invalid_utf8_text_names_the_line(tmp_path, fixture_corpus):
    wav, text = make_tables(tmp_path, fixture_corpus, n_text=24)
    data = text.read_bytes().splitlines(keepends=True)
    data[2] = data[2].split(b" ")[0] + b" " + "坏".encode("gbk") + b"\n"
    text.write_bytes(b"".join(data))
    result = funasr_scp2jsonl(wav, text, tmp_path / "o.jsonl")
    assert_user_error(result, "text:3: invalid UTF-8")


def test_pipe_entries_need_allow_pipe(tmp_path, fixture_corpus):
    flac = next(p for p in sorted((fixture_corpus / "wav").iterdir()) if p.suffix == ".flac")
    (tmp_path / "wav.scp").write_text(f"u1 sox {flac} -t wav - |\n")
    (tmp_path / "text").write_text("u1 hello\n")
    out = tmp_path / "o.jsonl"
    result = funasr_scp2jsonl(tmp_path / "wav.scp", tmp_path / "text", out)
    assert_user_error(result, "++allow_pipe=true")
    result = funasr_scp2jsonl(tmp_path / "wav.scp", tmp_path / "text", out, "++allow_pipe=true")
    assert result.returncode == 0, result.stderr
    assert read_jsonl(out)[0]["source_len"] == expected_source_len(str(flac))


@pytest.fixture
def http_root(tmp_path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_http_sources_are_probed_from_headers(http_root, fixture_corpus):
    root, base = http_root
    shutil.copytree(fixture_corpus / "wav", root / "wav")
    wav_lines, text_lines = [], []
    for line in (fixture_corpus / "wav.scp").read_text().splitlines()[:6]:
        key, path = line.split()
        wav_lines.append(f"{key} {base}/wav/{Path(path).name}")
    for line in (fixture_corpus / "text").read_text().splitlines()[:6]:
        text_lines.append(line)
    (root / "wav.scp").write_text("\n".join(wav_lines) + "\n")
    (root / "text").write_text("\n".join(text_lines) + "\n")
    out = root / "o.jsonl"
    result = funasr_scp2jsonl(root / "wav.scp", root / "text", out)
    assert result.returncode == 0, result.stderr
    for r in read_jsonl(out):
        assert r["source_len"] == expected_source_len(str(fixture_corpus / "wav" / Path(r["source"]).name))


def test_scp_jsonl_scp_round_trip_is_byte_identical(tmp_path, fixture_corpus):
    out = tmp_path / "x.jsonl"
    assert funasr_scp2jsonl(fixture_corpus / "wav.scp", fixture_corpus / "text", out).returncode == 0
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={out}",
                     f"++scp_file_list=[{tmp_path}/wav.scp,{tmp_path}/text]", "++data_type_list=[source,target]")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "wav.scp").read_bytes() == (fixture_corpus / "wav.scp").read_bytes()
    assert (tmp_path / "text").read_bytes() == (fixture_corpus / "text").read_bytes()
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={out}", f"++scp_file_list=[{tmp_path}/t2]",
                     "++data_type_list=[target]", "++separator=tab")
    assert (tmp_path / "t2").read_text().splitlines()[0].split("\t")[0] == "spk0-utt000"


def test_jsonl2scp_names_a_line_without_the_field(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"key": "a", "source": "a.wav"}\n\n{"key": "b"}\n')
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={src}", f"++scp_file_list=[{tmp_path}/wav.scp]",
                     "++data_type_list=[source]")
    assert_user_error(result, "in.jsonl:3", "'b'", "source")
    assert not (tmp_path / "wav.scp").exists()


@pytest.mark.parametrize("speaker, said", [("spk\n1", "holds whitespace (U+000A)"),
                                           ("spk 1", "holds whitespace (U+0020)"), ("", "speaker is empty")])
def test_a_speaker_that_is_not_one_token_is_refused_at_read_time_naming_file_line_and_field(tmp_path, speaker, said):
    """A list line's ``speaker`` is a field of utt2spk and spk2utt: jsonl2scp refuses one that is empty or holds
    whitespace, as a key, before writing any table (even one without the speaker), and so does every reader of
    the list (segment's, whose utt2spk it is); an integer speaker is its digits."""
    from corpus_io.errors import DataError
    from corpus_io.tables.inputs import iter_records

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"key": "a", "source": "a.wav", "target": "hi", "speaker": 7}) + "\n" +
                   json.dumps({"key": "b", "source": "b.wav", "target": "hi", "speaker": speaker}) + "\n")
    for fields, tables in (("[source,speaker]", f"[{tmp_path}/wav.scp,{tmp_path}/utt2spk]"),
                           ("[source]", f"[{tmp_path}/wav.scp]")):
        result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={src}", f"++data_type_list={fields}",
                         f"++scp_file_list={tables}")
        assert result.returncode == 2 and result.stderr.count("\n") <= 2, result.stderr
        assert_user_error(result, "in.jsonl:2", "key 'b'", "'speaker'", said, "rename the speaker")
        assert not (tmp_path / "wav.scp").exists() and not (tmp_path / "utt2spk").exists()
    with pytest.raises(DataError) as err:
        list(iter_records(str(src)))
    assert "in.jsonl:2: key 'b': 'speaker'" in str(err.value) and said in str(err.value)
    src.write_text(json.dumps({"key": "a", "source": "a.wav", "target": "hi", "speaker": 7}) + "\n")
    assert [r["speaker"] for r in iter_records(str(src))] == [7]


@pytest.mark.parametrize("line, needles", [
    ({"key": "utt 1", "source": "a.wav", "target": "hi"}, ["in.jsonl:2", "key 'utt 1' is not one word"]),
    ({"key": "", "source": "a.wav", "target": "hi"}, ["in.jsonl:2", "key '' is empty"]),
    ({"key": "b", "source": "a.wav", "target": "two\nlines"}, ["in.jsonl:2", "key 'b'", "target", "line break"]),
    ({"key": "b", "source": "a.wav", "target": "cr\rhere"}, ["in.jsonl:2", "line break"]),
    ({"key": "b", "source": "a.wav", "target": "  "}, ["in.jsonl:2", "target", "is empty"]),
])
def test_jsonl2scp_refuses_a_pair_a_kaldi_table_cannot_hold_and_writes_nothing(tmp_path, line, needles):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"key": "a", "source": "a.wav", "target": "ok"}) + "\n" + json.dumps(line) + "\n")
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={src}",
                     f"++scp_file_list=[{tmp_path}/wav.scp,{tmp_path}/text]",
                     "++data_type_list=[source,target]")
    assert_user_error(result, *needles)
    assert not (tmp_path / "wav.scp").exists() and not (tmp_path / "text").exists()


def test_jsonl_bad_json_names_the_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"key": "a", "source": "a.wav"}\n{"key": oops}\n')
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={src}", f"++scp_file_list=[{tmp_path}/wav.scp]",
                     "++data_type_list=[source]")
    assert_user_error(result, "in.jsonl:2: not valid JSON")


def _ls(directory) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir()) if Path(directory).exists() else []


def test_jsonl2scp_same_output_twice_is_a_config_error_before_writing(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"key": "a", "source": "a.wav", "target": "hi"}\n')
    out = tmp_path / "out"
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={src}",
                     f"++scp_file_list=[\"{out}/wav.scp\",\"{out}/../out/wav.scp\"]",
                     "++data_type_list=[source,target]")
    assert_user_error(result, "same file twice", f"{out}/wav.scp", "entry 2")
    assert result.returncode == 2 and _ls(out) == []
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={src}", f"++scp_file_list=[{src}]",
                     "++data_type_list=[source]")
    assert_user_error(result, "is the input ++jsonl_file_in")
    assert src.read_text().startswith('{"key": "a"')


def test_jsonl2scp_duplicate_key_names_both_lines_and_writes_nothing(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"key": "a", "source": "a.wav"}\n{"key": "b", "source": "b.wav"}\n\n'
                   '{"key": "a", "source": "c.wav"}\n')
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={src}", f"++scp_file_list=[{tmp_path}/out/wav.scp]",
                     "++data_type_list=[source]")
    assert_user_error(result, "duplicate key 'a'", "in.jsonl:1", "in.jsonl:4")
    assert result.returncode == 2 and _ls(tmp_path / "out") == []


def test_empty_inputs_are_errors_and_leave_no_output(tmp_path):
    (tmp_path / "wav.scp").write_text("")
    (tmp_path / "text").write_text("\n")
    (tmp_path / "in.jsonl").write_text("\n")
    out = tmp_path / "out"
    result = funasr_scp2jsonl(tmp_path / "wav.scp", tmp_path / "text", out / "o.jsonl")
    assert_user_error(result, "wav.scp has no utterances")
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={tmp_path}/in.jsonl",
                     f"++scp_file_list=[{out}/wav.scp]", "++data_type_list=[source]")
    assert_user_error(result, "in.jsonl has no utterances")
    assert _ls(out) == []


def test_scp2jsonl_with_every_utterance_skipped_leaves_no_output(tmp_path):
    (tmp_path / "wav.scp").write_text("u1 a.wav\n")
    (tmp_path / "text").write_text("u2 hello\n")
    out = tmp_path / "out" / "o.jsonl"
    result = funasr_scp2jsonl(tmp_path / "wav.scp", tmp_path / "text", out, "++on_error=skip")
    assert_user_error(result, "no utterance of", "missing in text: 1")
    assert _ls(out.parent) == []


def _edge_lengths(rate: int) -> list[int]:
    """Sample counts on both sides of 10 ms frame boundaries at 16 kHz, for a file at ``rate``."""
    lengths = {1, 159, 160, 161}
    for frames in (1, 10, 97, 250):
        boundary = frames * 160 * rate // 16000
        lengths.update(boundary + d for d in (-2, -1, 0, 1, 2))
    lengths.update({2204, 4408, 4799})  # the lengths where flooring n*100/sr was one frame short
    return sorted(n for n in lengths if n > 0)


def test_source_len_equals_funasr_rule_at_every_rate_on_edge_lengths(tmp_path, fixture_corpus):
    from corpus_io.audio import io as audio

    speech, rate = sf.read(next(p for p in sorted((fixture_corpus / "wav").iterdir()) if p.suffix == ".wav"),
                           dtype="float32")
    wav_lines, text_lines = [], []
    for sr in (8000, 16000, 22050, 32000, 44100, 48000):
        wave = audio.resample(speech, rate, sr)
        for n in _edge_lengths(sr):
            path = tmp_path / f"r{sr}_{n}.wav"
            sf.write(path, wave[:n], sr)
            wav_lines.append(f"r{sr}_{n} {path}")
            text_lines.append(f"r{sr}_{n} hello")
    (tmp_path / "wav.scp").write_text("\n".join(wav_lines) + "\n")
    (tmp_path / "text").write_text("\n".join(text_lines) + "\n")
    out = tmp_path / "o.jsonl"
    result = funasr_scp2jsonl(tmp_path / "wav.scp", tmp_path / "text", out)
    assert result.returncode == 0, result.stderr
    floor_differs = 0
    for r in read_jsonl(out):
        info = sf.info(r["source"])  # the header's sample count, as FunASR would see after decoding
        assert r["source_len"] == funasr_source_len(info.frames, info.samplerate), r
        floor_differs += r["source_len"] != info.frames * 100 // info.samplerate
    assert floor_differs >= 3  # the cases that used to be one frame short are in the set


def _tables_with(tmp_path, fixture_corpus, *, text_edit=None, wav_edit=None):
    wav, text = make_tables(tmp_path, fixture_corpus, n_text=24)
    if text_edit:
        text.write_text("\n".join(text_edit(text.read_text().splitlines())) + "\n")
    if wav_edit:
        wav.write_text("\n".join(wav_edit(wav.read_text().splitlines())) + "\n")
    return wav, text


def test_empty_transcripts_are_an_error_or_dropped_and_counted_with_on_empty_text_skip(tmp_path, fixture_corpus):
    def blank_two(lines):
        return [line.split()[0] if i in (2, 5) else line for i, line in enumerate(lines)]

    wav, text = _tables_with(tmp_path, fixture_corpus, text_edit=blank_two)
    out = tmp_path / "o.jsonl"
    assert_user_error(funasr_scp2jsonl(wav, text, out), "text:3", "has no value", "++on_empty_text=skip")
    assert not out.exists()
    result = funasr_scp2jsonl(wav, text, out, "++on_empty_text=skip")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    assert len(records) == 22 and all(r["target"].strip() for r in records)
    assert "skipped 2 (empty target: 2)" in result.stderr


def test_duplicate_keys_are_an_error_or_first_kept_and_counted_with_on_duplicate_skip(tmp_path, fixture_corpus):
    wav, text = _tables_with(tmp_path, fixture_corpus, wav_edit=lambda lines: lines + lines[:3],
                             text_edit=lambda lines: lines + [lines[0].split()[0] + " a different text"])
    out = tmp_path / "o.jsonl"
    assert_user_error(funasr_scp2jsonl(wav, text, out), "duplicate key", "text:1", "text:25", "++on_duplicate=skip")
    result = funasr_scp2jsonl(wav, text, out, "++on_duplicate=skip")
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out)
    keys = [r["key"] for r in records]
    assert len(keys) == 24 == len(set(keys))
    first_text = (fixture_corpus / "text").read_text().splitlines()[0].split(maxsplit=1)[1]
    assert records[0]["target"] == first_text  # the first line of a repeated key wins
    assert "duplicate key in wav.scp: 3" in result.stderr
    assert "duplicate key in text (first line kept): 1" in result.stderr


def test_unreadable_audio_error_names_ten_keys_and_the_count(tmp_path, fixture_corpus):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF not really a wav file")

    def break_twelve(lines):
        return [f"{line.split()[0]} {bad}" if i < 12 else line for i, line in enumerate(lines)]

    wav, text = _tables_with(tmp_path, fixture_corpus, wav_edit=break_twelve)
    keys = [line.split()[0] for line in wav.read_text().splitlines()]
    out = tmp_path / "o.jsonl"
    result = funasr_scp2jsonl(wav, text, out)
    assert_user_error(result, "12 utterance(s) have unreadable audio (and 2 more)", "++on_error=skip")
    named = [k for k in keys[:12] if f"key '{k}'" in result.stderr]
    assert named == keys[:10]
    assert not out.exists()


def test_a_non_numeric_source_len_or_start_names_the_line_and_key_and_numeric_strings_are_numbers(tmp_path):
    from corpus_io.tables.manifest import canonical

    assert canonical({"key": 1, "source": "a.wav", "source_len": "120", "start": "1.5"}) == \
        {"key": "1", "source": "a.wav", "source_len": 120, "start": 1.5}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"key": "a", "source": "a.wav", "target": "x", "source_len": "long"}) + "\n")
    result = run_cli("corpus-io", "pack-shards", f"++input={src}", f"++output_dir={tmp_path / 'o'}",
                     "++filter_group=[0:100]")
    assert_user_error(result, f"{src}:1", "key 'a'", "source_len is 'long', not an integer (10 ms frames)")
