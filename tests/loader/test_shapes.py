"""Batches shaped for the GPU: with the defaults an epoch uses few padded lengths and pads little, at the batch
sizes users set, over a corpus of 3,000 real-speech utterances of varied lengths; padding never changes what the
model computes."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import soundfile as sf

from corpus_io.api import build_tokenizer
from corpus_io.config import DatasetConf
from corpus_io.loader.batching import batch_shape, quantile_boundaries
from corpus_io.loader.dataset import build_dataloader
from corpus_io.loader.shapes import STEP, _steps, optimal_edges
from tests.loader_data import fixture_utts, token_list

NUM_UTTS = 3000


def _segments_corpus(out: Path, num: int = NUM_UTTS) -> tuple[Path, list[str]]:
    """A raw list of ``num`` segments (0.3 s to the whole recording) of the fixture's real recordings, each with a
    transcript of a length that follows its duration (a FunASR list with start/end, as a Kaldi segments dir gives)."""
    rng = random.Random(7)
    utts = fixture_utts()
    lengths = {path: sf.info(path).duration for _, path, _ in utts}
    words = [w for _, _, text in utts for w in text.split()]
    out.mkdir(parents=True, exist_ok=True)
    keys, lines = [], []
    for i in range(num):
        _, path, _ = utts[rng.randrange(len(utts))]
        dur = rng.uniform(0.3, lengths[path])
        start = round(rng.uniform(0.0, lengths[path] - dur), 3)
        text = " ".join(rng.choice(words) for _ in range(max(1, int(dur * 2))))
        key = f"seg{i:05d}"
        keys.append(key)
        lines.append(json.dumps({"key": key, "source": path, "target": text, "start": start,
                                 "end": round(start + dur, 3)}))
    path = out / "segments.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, keys


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    data_list, keys = _segments_corpus(out)
    return data_list, keys, build_tokenizer(token_list(out))


def _defaults(**overrides) -> DatasetConf:
    conf = DatasetConf()
    conf.data_type = "raw"
    conf.filter_conf.token_min_length = 0
    for key, value in overrides.items():
        setattr(conf, key, value)
    return conf


def _epoch_shapes(loader) -> tuple[Counter, float, list[str]]:
    """(padded lengths -> batches, padded share of all frames, keys) of one epoch."""
    widths: Counter = Counter()
    real = padded = 0
    keys: list[str] = []
    loader.set_epoch(0)
    for batch in loader:
        width, rows_real, rows_padded = batch_shape(batch)
        widths[width] += 1
        real += rows_real
        padded += rows_padded
        assert batch["target"].shape[1] % 8 == 0
        assert batch["target_lengths"].tolist() == batch["target"].ne(-1).sum(1).tolist()  # lengths stay exact
        keys += batch["keys"]
    return widths, 1.0 - real / padded, keys


@pytest.mark.slow
@pytest.mark.parametrize("batch_type,batch_size,feats_on", [("example", 32, "loader"), ("example", 256, "loader"),
                                                             ("length", 24000, "loader"), ("example", 32, "model")])
def test_default_batches_use_few_padded_lengths_and_pad_at_most_5_percent(corpus, batch_type, batch_size, feats_on):
    data_list, keys, tok = corpus
    conf = _defaults(batch_type=batch_type, batch_size=batch_size, feats_on=feats_on)
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    widths, padding, got = _epoch_shapes(loader)
    assert sorted(got) == sorted(keys)  # every utterance once
    assert len(widths) <= conf.num_buckets + 1, sorted(widths)
    assert padding <= 0.05, f"padding {padding:.3f}"
    # the sort buffer of before (each batch padded to its longest): a new length nearly every batch, more padding
    sorted_conf = _defaults(batch_type=batch_type, batch_size=batch_size, feats_on=feats_on, bucketing=False)
    before, padding_before, _ = _epoch_shapes(build_dataloader(str(data_list), sorted_conf, tok, train=True, rank=0,
                                                               world_size=1))
    assert len(before) >= 0.8 * sum(before.values()) and padding_before > padding, (before, padding_before)


def test_optimal_edges_pad_less_than_equal_count_quantiles():
    rng = random.Random(1)
    durations = [min(30.0, max(0.2, rng.lognormvariate(1.0, 0.7))) for _ in range(20000)]
    hist = Counter(_steps(d) for d in durations)

    def padding(edges: list[float]) -> float:
        import bisect

        padded = sum(edges[min(bisect.bisect_left(edges, _steps(d) * STEP - 1e-9), len(edges) - 1)]
                     for d in durations)
        return 1.0 - sum(durations) / padded

    best = optimal_edges(hist, 10)
    steps = [_steps(d) for d in durations]
    quantiles = [q * STEP for q in quantile_boundaries(steps, 10)] + [max(steps) * STEP]
    assert len(best) == 10 and best[-1] == pytest.approx(max(steps) * STEP)
    assert padding(best) < padding(quantiles)
    assert optimal_edges(Counter({100: 3}), 30) == [1.0]  # fewer lengths than buckets: one edge each


def test_padded_batch_gives_the_unpadded_ctc_loss_and_log_probs():
    import torch

    from corpus_io.model.model import ConformerCTC

    torch.manual_seed(0)
    model = ConformerCTC(80, 30, num_blocks=2).eval()
    feats = torch.randn(3, 200, 80)
    lengths = torch.tensor([200, 150, 97])
    target = torch.randint(1, 30, (3, 16))
    target_lengths = torch.tensor([16, 12, 7])
    padded = torch.nn.functional.pad(feats, (0, 0, 0, 57))
    padded[1, 150:] = 3.0  # padding of any value never reaches a real frame
    with torch.no_grad():
        log_probs, out_lengths = model(feats, lengths)
        log_probs_padded, out_lengths_padded = model(padded, lengths)
    assert out_lengths.tolist() == out_lengths_padded.tolist()
    for i, n in enumerate(out_lengths.tolist()):
        assert torch.allclose(log_probs[i, :n], log_probs_padded[i, :n], atol=1e-5)

    def ctc(lp, n):
        return torch.nn.functional.ctc_loss(lp.transpose(0, 1), target, n, target_lengths, reduction="sum")

    assert float(ctc(log_probs, out_lengths)) == pytest.approx(float(ctc(log_probs_padded, out_lengths_padded)),
                                                               abs=1e-5)


def test_each_bucket_takes_its_own_batch_size(corpus):
    data_list, keys, tok = corpus
    edges, sizes = [1.0, 2.0, 3.0, 10.0], [40, 20, 10, 5]
    conf = _defaults(batch_type="example", bucket_edges=edges, bucket_batch_size=sizes, num_workers=1)
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    from corpus_io.loader.shapes import edge_frames

    # the top edge, above the corpus's longest segment, pads to that segment instead, with its batch size
    planned = loader.conf.bucket_edges
    assert planned[:3] == edges[:3] and 3.0 < planned[3] < 10.0 and loader.conf.bucket_batch_size == sizes
    width_of = dict(zip(edge_frames(planned, conf), sizes))
    full: Counter = Counter()
    got = []
    for batch in loader:
        width = batch["feats"].shape[1]
        assert len(batch["keys"]) <= width_of[width]
        full[width] += len(batch["keys"]) == width_of[width]
        got += batch["keys"]
    assert sorted(got) == sorted(keys)
    assert all(full[w] >= 3 for w in width_of), full  # every bucket filled batches of exactly its size


def test_bucket_batch_sizes_without_matching_edges_are_refused(corpus):
    from corpus_io.errors import ConfigError

    data_list, _, tok = corpus
    with pytest.raises(ConfigError, match="one per bucket"):
        build_dataloader(str(data_list), _defaults(bucket_batch_size=[8, 4]), tok, train=True, rank=0, world_size=1)
    with pytest.raises(ConfigError, match="must rise strictly"):
        build_dataloader(str(data_list), _defaults(bucket_edges=[3.0, 2.0]), tok, train=True, rank=0, world_size=1)


@pytest.mark.slow
def test_synchronised_buckets_on_two_gloo_ranks_step_together_read_each_key_once_and_resume_exactly(tmp_path):
    """2 real gloo ranks (tests/uneven_ranks.py, docs/API.md's loop): at each step both ranks' batches come from one
    bucket (one padded length), but for the last few batches of an epoch (the buckets' rests); every key once per
    epoch; an epoch checkpointed mid-way and resumed trains each key once and stays in step."""
    import sys

    from tests.conftest import REPO, run_bounded

    data_list, keys = _segments_corpus(tmp_path / "even", 2000)  # two raw chunks of 1000: one per rank
    tokens = token_list(tmp_path)
    conf = {"data_type": "raw", "batch_size": 16, "num_buckets": 4, "num_workers": 1}
    base = {"data_list": str(data_list), "tokens": tokens.token_list, "dataset_conf": conf, "epochs": 2}
    runs = [{**base, "out": str(tmp_path / "whole")},
            {**base, "out": str(tmp_path / "resumed"), "save_after": [1, 30]},
            {**base, "out": str(tmp_path / "resumed"), "resume": True}]
    for run in runs:
        Path(run["out"]).mkdir(exist_ok=True)
    (tmp_path / "spec.json").write_text(json.dumps({"world_size": 2, "runs": runs}))
    result = run_bounded([sys.executable, str(REPO / "tests" / "uneven_ranks.py"), str(tmp_path / "spec.json")], 900)
    assert result.returncode == 0, result.stderr[-5000:]
    epochs = {out: [[json.loads((tmp_path / out / f"rank{r}.epoch{e}.json").read_text()) for r in range(2)]
                    for e in range(2)] for out in ("whole", "resumed")}
    for out in ("whole", "resumed"):
        for epoch in range(2):
            ranks = epochs[out][epoch]
            got = ranks[0]["keys"] + ranks[1]["keys"]
            assert len(got) == len(set(got)), f"{out} epoch {epoch}: a key twice"
            assert len(ranks[0]["widths"]) == len(ranks[1]["widths"])
            apart = [i for i, (a, b) in enumerate(zip(ranks[0]["widths"], ranks[1]["widths"])) if a != b]
            steps = len(ranks[0]["widths"])
            # apart only while a rank trains the rest the last epoch carried (ranks carry different amounts), and in
            # the tail, where each rank empties its buckets' rests (at most one partial batch per bucket)
            carry = -(-max(r["counts"].get("uneven_ranks.carried", 0) for r in epochs[out][epoch - 1]) // 16) \
                if epoch else 0
            assert all(i < carry or i >= steps - 2 * (conf["num_buckets"] + 1) for i in apart), \
                (out, epoch, apart, steps, carry)
            assert len(apart) < 0.25 * steps
            unused = sum(r["counts"].get("uneven_ranks.unused", 0) for r in ranks)
            assert len(got) + unused == len(keys) or epoch > 0, (out, epoch, len(got), unused)


def _indexed_shards(out: Path) -> tuple[Path, list[list[float]]]:
    """The fixture corpus as 3 shards of 8 whose index records each utterance's ``durations``, as pack-shards does;
    returns (data.list, the durations per shard)."""
    from corpus_io.shards.index import index_path_for
    from tests.loader_data import make_shards

    data_list, _ = make_shards(out, per_shard=8)
    index = index_path_for(data_list)
    utts = fixture_utts()
    entries, every = [], []
    for n, line in enumerate(index.read_text().splitlines()):
        entry = json.loads(line)
        every.append([round(sf.info(path).duration, 2) for _, path, _ in utts[8 * n:8 * n + 8]])
        entries.append({**entry, "durations": every[-1]})
    index.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return data_list, every


@pytest.mark.parametrize("edit, why", [
    (lambda d: d.__setitem__(3, "NaN"), "durations[3] is 'nan'"),
    (lambda d: d.__setitem__(3, "Infinity"), "durations[3] is 'inf'"),
    (lambda d: d.__setitem__(3, None), "durations[3] is 'None'"),
    (lambda d: d.__setitem__(3, -d[3]), "not a finite number of seconds >= 0"),
    (lambda d: d.__setitem__(3, str(d[3])), "durations[3] is"),
    (lambda d: d.pop(), "durations lists 7 values but num_utts is 8"),
    (lambda d: d.__setitem__(slice(None), [1000 * x for x in d]), "but durations sum to"),
    (lambda d: d.clear() or d.append("missing"), "has no 'durations'"),
])
def test_bad_index_durations_are_one_data_error_naming_the_shard_entry(tmp_path, edit, why):
    """The loader reads the index's durations for its bucket edges: a value that is not one utterance's seconds, a
    wrong count or an entry without them (beside entries with them) is a DataError naming the index line, the shard
    and its list entry, not a traceback or edges from wrong numbers."""
    from corpus_io.errors import DataError
    from corpus_io.shards.index import index_path_for

    data_list, _ = _indexed_shards(tmp_path / "c")
    index = index_path_for(data_list)
    entries = [json.loads(line) for line in index.read_text().splitlines()]
    edit(entries[1]["durations"])
    if entries[1]["durations"] == ["missing"]:
        del entries[1]["durations"]
    text = "".join(json.dumps(e) + "\n" for e in entries).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
    index.write_text(text)
    tok = build_tokenizer(token_list(tmp_path))
    with pytest.raises(DataError) as err:
        build_dataloader(str(data_list), _defaults(data_type="shard"), tok, train=True, rank=0, world_size=1)
    message = str(err.value)
    assert why in message and entries[1]["path"] in message and str(index) in message, message
    assert f"entry 2 of {data_list}" in message and "pack-shards" in message


def test_a_top_edge_beyond_the_data_pads_to_the_longest_utterance(tmp_path):
    """bucket_edges above every utterance (up to the documented 86400 s) pad to the longest utterance, not to the
    edge: memory is bounded by the data. Every utterance is still read once."""
    data_list, every = _indexed_shards(tmp_path / "c")
    tok = build_tokenizer(token_list(tmp_path))
    longest = max(max(d) for d in every)
    huge = build_dataloader(str(data_list), _defaults(data_type="shard", bucket_edges=[86400.0]), tok, train=True,
                            rank=0, world_size=1)
    assert huge.conf.bucket_edges == [longest]  # planned, no batch read
    conf = _defaults(data_type="shard", bucket_edges=[1.0, 600.0], bucket_batch_size=[8, 4], num_workers=0)
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    assert loader.conf.bucket_edges == [1.0, longest] and loader.conf.bucket_batch_size == [8, 4]
    widths, padding, keys = _epoch_shapes(loader)
    frames = max(int(round(100 * x)) for d in every for x in d)
    assert max(widths) <= frames + 1, sorted(widths)  # 600 s would be 60,000 frames
    assert sorted(keys) == sorted(k for k, _, _ in fixture_utts()) and padding < 0.5


@pytest.mark.parametrize("shares, edges, why", [
    ([0.5, 0.5], [2.0, 5.0, 10.0], "gives 2 shares, one per bucket, but dataset_conf.bucket_edges gives 3 edges"),
    ([0.5, 0.3, 0.1], [2.0, 5.0, 10.0], "sums to 0.9, not 1"),
    ([1.5, -0.5], [2.0, 5.0], "bucket_shares[0]=1.5 is outside its range [0, 1]"),  # config/checks.py's range
    ([0.5, 0.5], None, "dataset_conf.bucket_edges is not given"),
])
def test_bucket_shares_that_do_not_fit_the_edges_are_a_config_error_naming_the_key(corpus, shares, edges, why):
    from corpus_io.errors import ConfigError

    data_list, _, tok = corpus
    with pytest.raises(ConfigError, match="dataset_conf.bucket_shares") as err:
        build_dataloader(str(data_list), _defaults(bucket_shares=shares, bucket_edges=edges), tok, train=True, rank=0,
                         world_size=1)
    assert why in str(err.value)
