"""decode as N jobs (``++num_jobs=N ++job_index=J``, then ``merge-jobs``) and decode's rows streamed to disk."""

from __future__ import annotations

import json

from tests.test_hostile import corpus_io as in_process

#: everything a decode with times and pseudo-labels writes
OUTPUTS = ("text", "nbest", "ref", "cer.txt", "wer.txt", "ctm", "timestamps.jsonl", "confidence", "kept_text",
           "kept.list")


def _without_timing(name: str, data: bytes) -> bytes:
    """The report's second line is its RTF (wall seconds): it differs between any two runs, one job or N."""
    if name not in ("cer.txt", "wer.txt"):
        return data
    lines = data.split(b"\n")
    assert lines[1].startswith(b"RTF "), lines[:2]
    return b"\n".join(lines[:1] + lines[2:])


def test_decode_as_jobs_merges_to_the_bytes_of_one_job(one_step_run, corpus, tmp_path, capfd):
    """Each job decodes its contiguous share of the list (a raw list's lines; a shard list's shards, a job past them
    loading no model) into its part, writing no final file; merge-jobs writes text, nbest, ref, the reports, ctm,
    timestamps.jsonl, confidence, kept_text and kept.list as one job writes them (the reports but for their RTF)."""
    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]
    common = [f"++checkpoint={one_step_run['out'] / 'model.pt.ep0'}", "++dataset_conf.num_workers=0", "++device=cpu",
              "++timestamps=true", "++min_confidence=0.01"]
    for name, listed, n, extra in (
            ("raw", [f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw"], 2,
             ["++decoding.method=ctc_prefix_beam", "++decoding.beam=3", "++decoding.nbest=3"]),
            ("shards", [f"++data_list={corpus['shards']}"], 4, [])):
        one = tmp_path / f"{name}_one"
        rc, err = in_process("decode", *listed, *common, *extra, f"++output_dir={one}", capfd=capfd)
        assert rc == 0, err[-3000:]
        parts = tmp_path / f"{name}_parts"
        for j in range(1, n + 1):
            rc, err = in_process("decode", *listed, *common, *extra, f"++output_dir={parts}", f"++num_jobs={n}",
                                 f"++job_index={j}", capfd=capfd)
            assert rc == 0, err[-3000:]
        assert not any((parts / output).exists() for output in OUTPUTS)
        rc, err = in_process("merge-jobs", f"++path={parts}", capfd=capfd)
        assert rc == 0, err[-3000:]
        written = [o for o in OUTPUTS if (one / o).exists()]
        assert written == list(OUTPUTS if name == "raw" else OUTPUTS[:-1]), written
        for output in written:
            assert _without_timing(output, (parts / output).read_bytes()) == \
                _without_timing(output, (one / output).read_bytes()), (name, output)
        assert len((one / "text").read_text(encoding="utf-8").splitlines()) == \
            len(corpus["raw_keys"] if name == "raw" else corpus["keys"])


def test_a_finished_decode_job_rerun_is_already_complete_and_merge_jobs_names_a_missing_part(one_step_run, corpus,
                                                                                            tmp_path, capfd):
    """A job whose part record proves it done does nothing when run again (it says so); merge-jobs with a part
    missing refuses in one line naming the part and the job to run, and writes nothing."""
    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]
    out = tmp_path / "dec"
    args = [f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw", "++dataset_conf.num_workers=0",
            f"++checkpoint={one_step_run['out'] / 'model.pt.ep0'}", "++device=cpu", f"++output_dir={out}",
            "++num_jobs=2", "++job_index=1"]
    rc, err = in_process("decode", *args, capfd=capfd)
    assert rc == 0, err[-3000:]
    record = out / "decode.part-000001-of-000002.json"
    before = record.read_bytes()
    capfd.readouterr()
    from corpus_io.config import DecodeConfig, compose
    from corpus_io.infer.decode import decode

    decode(compose(DecodeConfig, "decode", args))
    said = capfd.readouterr().out
    assert "decode job 1 of 2: already complete" in said, said
    assert record.read_bytes() == before
    rc, err = in_process("merge-jobs", f"++path={out}", capfd=capfd)
    assert rc == 2, err
    message = err.strip()
    assert message.startswith("error: part 2 of 2 is missing") and "decode.part-000002-of-000002.json" in message \
        and "++num_jobs=2 ++job_index=2" in message and "Traceback" not in err, err
    assert not (out / "text").exists() and not (out / "cer.txt").exists()


def test_decode_rows_go_to_disk_as_decoded_and_are_sorted_there_a_repeat_kept_once(tmp_path, monkeypatch, capfd):
    """run_search with ``rows`` hands each utterance's row on as its batch is searched and keeps none of them; the
    rows are sorted on disk in runs (here of 3 lines), a key decoded twice kept once (its last row), with a
    warning."""
    import torch

    from corpus_io.decoding.beam import Hyp
    from corpus_io.infer import decode
    from corpus_io.storage import sorting

    class Tok:
        def decode(self, ids):
            return " ".join(f"w{i}" for i in ids)

    class Search:
        context, hotwords = None, []

        def __call__(self, log_probs, lengths, encoder=None):
            return [[Hyp([int(n)], -1.0, 0.0)] for n in lengths.tolist()]

    keys = ["k5", "k1", "k9", "k3", "k1", "k7", "k2", "k8"]
    written: list[list[str]] = []

    def batches():
        for b in range(0, len(keys), 2):
            ks = keys[b:b + 2]
            yield decode.Forward(ks, [f"ref {k}" for k in ks], 1.0, None, torch.tensor([b, b + 1]), None, 0.0)
            written.append([r["key"] for r in seen])  # what was handed on before the next batch was made

    seen: list[dict] = []
    run = decode.run_search(None, batches(), Tok(), Search(), where="x", rows=seen.append)
    assert run.nbest == {} and run.refs == {} and run.decoded == len(keys)
    assert written[0] == ["k5", "k1"]  # the first batch's rows left before the loader gave the second
    spill = tmp_path / "spill.jsonl"
    spill.write_text("".join(json.dumps({**r, "tokens": 2}) + "\n" for r in seen), encoding="utf-8")
    monkeypatch.setattr(sorting, "SORT_LINES", 3)
    with open(tmp_path / "rows.jsonl", "w", encoding="utf-8") as f:
        got = decode.sorted_rows(spill, f, run, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    assert got == 7 and [r["key"] for r in rows] == sorted(set(keys))
    assert rows[0]["nbest"] == [["w4", -1.0]]  # k1's second row (its last) is kept
    err = capfd.readouterr().err
    assert run.repeats == {"k1": 2} and "1 keys were decoded more than once (e.g. 'k1' 2 times)" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "spill.jsonl"]  # its runs are gone
