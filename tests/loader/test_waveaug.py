"""Reverberation, noise and volume in the loader (corpus_io.loader.waveaug): the issue's acceptance on the real
fixture recordings as speech, synthetic white noise and real speech as babble noise, a simulated impulse
response (pyroomacoustics, recipes/tools/make_rirs.py). Each utterance's final waveform is read back from the
dump (``dump_audio_dir``), the clean one from a run without augmentation."""

from __future__ import annotations

import http.server
import importlib.util
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from corpus_io.config import DatasetConf
from corpus_io.loader.build import describe_chain, loader_chain
from corpus_io.loader.dataset import build_dataloader
from corpus_io.loader.read import ReadOptions
from corpus_io.loader.waveaug import Pool
from tests.loader_data import REPO, fixture_utts, make_shards, read_then_checkpoint, small_conf

_spec = importlib.util.spec_from_file_location("make_rirs", REPO / "recipes" / "tools" / "make_rirs.py")
make_rirs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_rirs)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("waveaug")
    speech, keys = make_shards(root / "speech", per_shard=6)
    rng = np.random.default_rng(0)
    sf.write(root / "white.wav", (rng.standard_normal(16000) * 0.05).astype(np.float32), 16000, subtype="PCM_16")
    (root / "white.scp").write_text(f"white {root / 'white.wav'}\n")
    rir_scp = make_rirs.make_rirs(root / "rirs", num=1, seed=3)
    return {"root": root, "speech": str(speech), "keys": keys, "white": str(root / "white.scp"), "rir": str(rir_scp),
            "rir_samples": sf.read(root / "rirs" / "rir" / "rir00000.wav", dtype="float32")[0]}


def conf_of(**conf) -> DatasetConf:
    """A small dataset_conf with ``conf`` set (``a__b=v`` sets ``a.b``)."""
    c = small_conf()
    for dotted, value in conf.items():
        obj = c
        *path, last = dotted.split("__")
        for name in path:
            obj = getattr(obj, name)
        setattr(obj, last, value)
    return c


def dump(data, out: Path, *, epoch: int = 0, num_workers: int = 0, rank: int = 0, world_size: int = 1,
         **conf) -> dict[str, np.ndarray]:
    """Run one epoch with ``conf`` set on a small dataset_conf; each utterance's dumped waveform by key."""
    c = conf_of(num_workers=num_workers, **conf)
    loader = build_dataloader(data["speech"], c, None, train=True, rank=rank, world_size=world_size)
    loader.dataset.dump_audio_dir = str(out)
    loader.set_epoch(epoch)
    for _ in loader:
        pass
    return {p.stem: sf.read(p, dtype="float32")[0] for p in sorted(out.glob("*.wav"))}


def resumed(data, out: Path, **conf) -> tuple[list[str], list[str]]:
    """Epoch 2 read for two batches on one rank, checkpointed, and its rest on two ranks dumped to ``out``: (the
    keys seen, the keys of the rest)."""
    c = conf_of(num_workers=0, **conf)
    first = build_dataloader(data["speech"], c, None, train=True, rank=0, world_size=1)
    seen, state = read_then_checkpoint(first, epoch=2, batches=2)
    rest: list[str] = []
    for rank in range(2):  # the rest on two ranks
        loader = build_dataloader(data["speech"], c, None, train=True, rank=rank, world_size=2)
        loader.load_rank_states([state])
        loader.dataset.dump_audio_dir = str(out)
        for batch in loader:
            rest += batch["keys"]
    return seen, rest


def noisy(white: str, **more) -> dict:
    return {"add_noise": True, "add_noise_conf__noise_list": white, "add_noise_conf__snr_db": [5.0, 10.0],
            "add_noise_conf__prob": 1.0, **more}


def active(clean: np.ndarray, rate: int = 16000) -> np.ndarray:
    """The test's own reading of "active samples": 20 ms frames above 1 % of the mean frame power."""
    frame = rate // 50
    n = -(-clean.size // frame) * frame
    power = (np.pad(clean, (0, n - clean.size)) ** 2).reshape(-1, frame).mean(axis=1)
    return np.repeat(power > 0.01 * power.mean(), frame)[:clean.size]


@pytest.fixture(scope="module")
def clean(data, tmp_path_factory):
    return dump(data, tmp_path_factory.mktemp("clean"))


def test_every_noisy_utterance_is_within_the_drawn_snr_range_against_its_clean_source(data, clean, tmp_path):
    mixed = dump(data, tmp_path, **noisy(data["white"]))
    assert sorted(mixed) == sorted(data["keys"]) == sorted(clean)
    for key, y in mixed.items():
        x = clean[key]
        scale = float(y @ x) / float(x @ x)  # the peak guard may have scaled the whole mix down
        residual = y - scale * x
        mask = active(x)
        snr = 10 * np.log10(np.sum((scale * x[mask]) ** 2) / np.sum(residual[mask] ** 2))
        assert 4.0 <= snr <= 11.0, (key, snr)
        assert np.abs(y).max() <= 32767 / 32768 + 1e-6


def test_one_impulse_response_gives_the_clean_signal_convolved_with_it_aligned_to_its_direct_path(data, clean,
                                                                                                   tmp_path):
    wet = dump(data, tmp_path, add_reverb=True, add_reverb_conf__rir_list=data["rir"], add_reverb_conf__prob=1.0)
    rir = data["rir_samples"]
    lag = int(np.argmax(np.abs(rir)))
    assert lag > 10  # the simulated response has a delay before its direct path: alignment is tested
    for key, y in wet.items():
        x = clean[key]
        expected = np.convolve(x, rir)[lag:lag + x.size]
        assert y.size == x.size
        assert np.corrcoef(y, expected)[0, 1] > 0.98, key
        mask = active(x)
        assert np.mean(y[active(y)] ** 2) == pytest.approx(np.mean(x[mask] ** 2), rel=0.05)  # the dry energy


def test_the_same_seed_and_epoch_dump_identical_bytes_and_another_epoch_other_draws(data, tmp_path):
    conf = {**noisy(data["white"]), "add_reverb": True, "add_reverb_conf__rir_list": data["rir"],
            "volume_perturb": True}
    dump(data, tmp_path / "a", **conf)
    dump(data, tmp_path / "b", num_workers=2, **conf)  # other workers, other batches: the same draws
    dump(data, tmp_path / "e1", epoch=1, **conf)
    names = sorted(p.name for p in (tmp_path / "a").glob("*.wav"))
    assert names and names == sorted(p.name for p in (tmp_path / "b").glob("*.wav"))
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)
    differ = [n for n in names if (tmp_path / "a" / n).read_bytes() != (tmp_path / "e1" / n).read_bytes()]
    assert len(differ) == len(names)
    draws = {d: sorted((tmp_path / d / "draws.jsonl").read_text().splitlines()) for d in ("a", "b", "e1")}
    assert draws["a"] == draws["b"] != draws["e1"]  # the workers append in their own order


def test_an_interrupted_epoch_resumed_on_another_world_size_reproduces_the_rest_speed_perturbed_too(data,
                                                                                                 tmp_path):
    conf = {**noisy(data["white"]), "add_reverb": True, "add_reverb_conf__rir_list": data["rir"],
            "add_reverb_conf__prob": 0.5, "volume_perturb": True, "speed_perturb": True}
    whole = dump(data, tmp_path / "whole", epoch=2, **conf)
    seen, rest = resumed(data, tmp_path / "rest", **conf)
    assert seen and rest and sorted(seen + rest) == sorted(whole)
    for key in rest:
        assert (tmp_path / "rest" / f"{key}.wav").read_bytes() == (tmp_path / "whole" / f"{key}.wav").read_bytes()


def test_the_chain_log_shows_speed_reverb_noise_volume_then_features_in_that_order(data):
    c = small_conf(speed_perturb=True, add_noise=True, add_reverb=True, volume_perturb=True, spec_aug=True)
    c.add_noise_conf.noise_list, c.add_reverb_conf.rir_list = data["white"], data["rir"]
    log = describe_chain(loader_chain(c, None, train=True))
    order = [log.index(f" {name}(") for name in ("speed_perturb", "add_reverb", "add_noise", "volume_perturb",
                                                  "fbank", "spec_aug")]
    assert order == sorted(order)
    assert "add_noise" not in describe_chain(loader_chain(c, None, train=False))  # cv: no augmentation


def _noise_shards(root: Path, shards: int) -> str:
    """``shards`` shards of the real fixture recordings, used as babble noise."""
    utts = fixture_utts(-(-shards * 4 // 24))
    return str(make_shards(root, utts=utts[:shards * 4], per_shard=4)[0])


def test_a_noise_pool_from_shards_holds_its_budget_in_the_same_memory_whatever_the_corpus_size(tmp_path):
    opts = ReadOptions(storage_options={})
    peaks = []
    for shards in (3, 30):
        lst = _noise_shards(tmp_path / f"n{shards}", shards)
        tracemalloc.start()
        pool = Pool(lst, seconds=4.0, sample_rate=16000, opts=opts, what="noise")
        segments = pool.for_epoch(777, 0)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert sum(s.size for s in segments) == 4 * 16000
    assert peaks[1] < 1.5 * peaks[0], peaks  # ten times the corpus, the same memory


def test_bench_loader_dumps_the_same_waveforms_from_the_device_path_as_from_the_loader_path(data, tmp_path):
    from corpus_io.config import BenchLoaderConfig
    from corpus_io.loader.bench import bench_loader

    dumps = {}
    for feats_on in ("loader", "model"):
        cfg = BenchLoaderConfig(data_list=data["speech"], dump_audio_dir=str(tmp_path / feats_on))
        cfg.dataset_conf = small_conf(num_workers=0, feats_on=feats_on, add_noise=True, add_reverb=True,
                                      volume_perturb=True)
        cfg.dataset_conf.add_noise_conf.noise_list = data["white"]
        cfg.dataset_conf.add_reverb_conf.rir_list = data["rir"]
        bench_loader(cfg)
        dumps[feats_on] = {p.stem: sf.read(p, dtype="float32")[0] for p in (tmp_path / feats_on).glob("*.wav")}
    assert sorted(dumps["model"]) == sorted(dumps["loader"]) == sorted(data["keys"])
    for key, y in dumps["loader"].items():
        assert np.abs(dumps["model"][key] - y).max() < 1e-4, key


class _RangeServer(http.server.BaseHTTPRequestHandler):
    """Serves ``root`` with Range support (a random-access reader would use it); logs each request as
    ``{"path", "method", "range", "start", "sent"}`` (``sent``: body bytes the socket took)."""

    root: Path
    requests: list[dict]

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        path = self.root / self.path.lstrip("/")
        entry = {"path": self.path.lstrip("/"), "method": self.command, "range": self.headers.get("Range"),
                 "start": 0, "sent": 0}
        self.requests.append(entry)
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start, end = 0, len(data)
        if entry["range"]:
            first, _, last = entry["range"].removeprefix("bytes=").partition("-")
            start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
            entry["start"] = start
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if not body:
            return
        try:
            for i in range(start, end, 1 << 16):
                self.wfile.write(data[i:min(end, i + (1 << 16))])
                entry["sent"] += min(end, i + (1 << 16)) - i
        except (BrokenPipeError, ConnectionResetError):
            pass


def test_noise_shards_over_http_are_each_read_once_per_pass_from_their_start_and_in_list_order(data, tmp_path):
    www = tmp_path / "www"
    shards = [Path(u).name for u in Path(_noise_shards(www, 5)).read_text().split()]
    handler = type("Logged", (_RangeServer,), {"root": www, "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        (www / "http.list").write_text("".join(f"{base}/{name}\n" for name in shards))
        c = conf_of(num_workers=0, **noisy(f"{base}/http.list", add_noise_conf__buffer_seconds=3600.0))
        for epoch in (0, 1):  # a pass each: the pool of each epoch reads the whole list (the budget holds it)
            handler.requests.clear()
            loader = build_dataloader(data["speech"], c, None, train=True, rank=0, world_size=1)
            loader.set_epoch(epoch)
            assert sum(len(b["keys"]) for b in loader) == len(data["keys"])
            got = [r for r in handler.requests if r["path"] in shards]
            names = [r["path"] for r in got]
            assert sorted(names) == sorted(shards), handler.requests  # each shard requested once
            first = shards.index(names[0])
            assert names == shards[first:] + shards[:first]  # in list order from the window's entry, wrapping
            assert not [r for r in handler.requests if r["method"] != "GET" or r["range"]], handler.requests
            assert all(r["sent"] == (www / r["path"]).stat().st_size for r in got)  # each streamed to its end
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- refused noise and impulse responses


def _bad_files(root: Path) -> dict[str, Path]:
    """An all-zero 16-bit WAV, a float WAV of NaN and infinities, and a text file named .wav."""
    root.mkdir(parents=True, exist_ok=True)
    sf.write(root / "zero.wav", np.zeros(8000, dtype=np.float32), 16000, subtype="PCM_16")
    nan = np.full(8000, 0.1, dtype=np.float32)
    nan[100], nan[200] = np.nan, np.inf
    sf.write(root / "nan.wav", nan, 16000, subtype="FLOAT")
    (root / "notes.wav").write_text("these are my notes, not audio\n")
    return {"zero": root / "zero.wav", "nan": root / "nan.wav", "text": root / "notes.wav"}


@pytest.mark.parametrize("what", ["noise", "impulse response"])
@pytest.mark.parametrize("bad, why", [("zero", "every sample is zero"), ("nan", "2 non-finite samples (NaN or "
                                                                                "infinity), the first at sample 100"),
                                      ("text", "cannot decode audio (Format not recognised")])
def test_a_silent_non_finite_or_non_audio_entry_is_refused_at_load_naming_its_list_line_and_file(data, tmp_path, what,
                                                                                                 bad, why):
    from corpus_io.errors import DataError

    files = _bad_files(tmp_path / "files")
    lst = tmp_path / "pool.scp"
    lst.write_text(f"good {data['root'] / 'white.wav'}\nbad {files[bad]}\n")
    before = {p: p.read_bytes() for p in [lst, *files.values()]}
    pool = Pool(str(lst), seconds=10.0, sample_rate=16000, opts=ReadOptions(storage_options={}), what=what)
    with pytest.raises(DataError) as err:
        for epoch in range(4):  # the window starts at either line: the bad one is met in the first pool or so
            pool.for_epoch(0, epoch)
    text = str(err.value)
    assert text.startswith(f"the {what} list {lst}: {lst}:2: key 'bad' ({files[bad]}): the file: ")
    assert why in text and "++dataset_conf.on_error=skip" in text
    assert "BytesIO" not in text and "Re-pack" not in text and "utterance" not in text
    assert {p: p.read_bytes() for p in before} == before


def test_with_skip_a_refused_noise_or_impulse_response_is_counted_and_never_applied(data, tmp_path):
    from collections import Counter

    files = _bad_files(tmp_path / "files")
    good = sf.read(data["root"] / "white.wav", dtype="float32")[0]
    for what, tag in (("noise", "noise"), ("impulse response", "rir")):
        lst = tmp_path / f"{tag}.scp"
        lines = [f"{name} {path}\n" for name, path in files.items()]
        lst.write_text("".join(lines) + f"good {data['root'] / 'white.wav'}\n")
        counts: Counter = Counter()
        pool = Pool(str(lst), seconds=10.0, sample_rate=16000, opts=ReadOptions(storage_options={}, on_error="skip"),
                    what=what, counts=counts)
        segments = pool.for_epoch(0, 0)
        assert counts == Counter({f"{tag}.refused": 3})  # each bad line once (the window wraps round once)
        assert len(segments) == 1 and np.array_equal(segments[0].astype(np.float32) / 32768, good)


def test_bench_loader_with_a_noise_list_of_text_files_names_the_noise_list_and_its_first_bad_line(data, tmp_path):
    from tests.conftest import assert_user_error, run_cli
    from tests.loader_data import token_list

    (tmp_path / "a.txt").write_text("not audio\n")
    (tmp_path / "b.txt").write_text("not audio either\n")
    lst = tmp_path / "noise.scp"
    lst.write_text(f"a {tmp_path / 'a.txt'}\nb {tmp_path / 'b.txt'}\n")
    result = run_cli("corpus-io", "bench-loader", f"++data_list={data['speech']}",
                     f"++tokenizer.token_list={token_list(tmp_path).token_list}", "++dataset_conf.add_noise=true",
                     f"++dataset_conf.add_noise_conf.noise_list={lst}", "++dataset_conf.num_workers=0",
                     env={"OMP_NUM_THREADS": "1"})
    assert_user_error(result, f"the noise list {lst}: {lst}:", "cannot decode audio (Format not recognised",
                      "++dataset_conf.on_error=skip")
    assert "BytesIO" not in result.stderr and "Re-pack" not in result.stderr


def test_bench_loader_dump_audio_dir_writes_each_utterances_draws_the_same_from_both_paths(data, tmp_path):
    import json

    from corpus_io.config import BenchLoaderConfig
    from corpus_io.loader.bench import bench_loader

    rir_keys = [line.split()[0] for line in Path(data["rir"]).read_text().splitlines()]
    drawn = {}
    for feats_on in ("loader", "model"):
        out = tmp_path / feats_on
        cfg = BenchLoaderConfig(data_list=data["speech"], dump_audio_dir=str(out))
        cfg.dataset_conf = small_conf(num_workers=0, feats_on=feats_on, add_noise=True, add_reverb=True,
                                      volume_perturb=True, speed_perturb=True)
        cfg.dataset_conf.add_noise_conf.noise_list = data["white"]
        cfg.dataset_conf.add_noise_conf.snr_db = [5.0, 10.0]
        cfg.dataset_conf.add_reverb_conf.prob = 1.0
        cfg.dataset_conf.add_reverb_conf.rir_list = data["rir"]
        (out / "draws.jsonl").parent.mkdir(parents=True)
        (out / "draws.jsonl").write_text('{"key": "from an earlier run"}\n')  # a fresh run starts the file anew
        bench_loader(cfg)
        lines = [json.loads(line) for line in (out / "draws.jsonl").read_text().splitlines()]
        assert sorted(d["key"] for d in lines) == sorted(data["keys"]) == sorted(p.stem for p in out.glob("*.wav"))
        drawn[feats_on] = {d["key"]: d for d in lines}
    assert drawn["model"] == drawn["loader"]  # the same draws whichever path applies them
    white = sf.info(data["root"] / "white.wav").frames
    for d in drawn["loader"].values():
        assert d["epoch"] == 0 and d["speed"] in (0.9, 1.0, 1.1) and d["rir"] in rir_keys
        assert d["noise"] == "white" and 0 <= d["noise_offset"] < white and 5.0 <= d["snr_db"] <= 10.0
        assert -6.0 <= d["gain_db"] <= 6.0


# --------------------------------------------------------------------------- digital silence (issue 60)


def _padded(data, out: Path, **conf) -> tuple[dict, dict, dict]:
    """One training epoch with silence_pad at prob 1: each key's features, and on the loader path its dumped
    (padded) waveform and its drawn ``[before, after]`` samples of silence."""
    import json

    import torch

    from corpus_io.model.frontend import build_front_end, model_inputs

    c = conf_of(num_workers=0, shuffle=False, silence_pad=True, silence_pad_conf__prob=1.0, **conf)
    loader = build_dataloader(data["speech"], c, None, train=True, rank=0, world_size=1)
    loader.dataset.dump_audio_dir = str(out)
    loader.set_epoch(0)
    front_end = build_front_end(c, "cpu")
    feats = {}
    for batch in loader:
        f, n = model_inputs(front_end, batch, torch.device("cpu"), train=True)
        feats.update({k: f[i, :int(n[i])] for i, k in enumerate(batch["keys"])})
    if c.feats_on == "model":  # the chain dumps no waveform (bench-loader does): the loader path's tell
        return feats, {}, {}
    wavs = {p.stem: sf.read(p, dtype="float32")[0] for p in sorted(out.glob("*.wav"))}
    silence = {d["key"]: d.get("silence") for d in map(json.loads, (out / "draws.jsonl").read_text().splitlines())}
    return feats, wavs, silence


def test_silence_pad_adds_exact_zeros_whose_training_features_are_decodes_features_of_zeros(data, clean, tmp_path):
    """The padding is digital silence: exact zeros in the waveform and, with the training dither on (the default),
    in the features the model hears: the frames inside it equal what decode (no dither) computes from the same
    samples, on both paths (loader and device front end); the speech's frames are dithered."""
    import torch

    from corpus_io.audio import features

    feats, wavs, silence = _padded(data, tmp_path / "loader")
    on_model, _, _ = _padded(data, tmp_path / "model", feats_on="model")
    assert sorted(feats) == sorted(wavs) == sorted(data["keys"]) == sorted(on_model)
    c = conf_of().fbank_conf
    window, shift, _ = features.window_geometry(16000, c.frame_length, c.frame_shift)
    sides = set()
    for key, wav in wavs.items():
        before, after = silence[key]
        sides.add((before > 0, after > 0))
        assert 1600 <= before + after <= 32000 and wav.size == clean[key].size + before + after, key
        assert not wav[:before].any() and not wav[wav.size - after:].any(), key  # exact zeros
        assert np.array_equal(wav[before:wav.size - after], clean[key]), key  # the speech untouched
        decoded, frames = features.batch_fbank(torch.from_numpy(wav)[None], torch.tensor([wav.size]), 16000,
                                               num_mel_bins=c.num_mel_bins, frame_length=c.frame_length,
                                               frame_shift=c.frame_shift, low_freq=c.low_freq, high_freq=c.high_freq,
                                               snip_edges=c.snip_edges)
        decoded = decoded[0, :int(frames[0])]
        assert feats[key].shape == decoded.shape == on_model[key].shape, key
        # frame k reads samples [k * shift + shift // 2 - window // 2, + window) (reflected past the ends)
        start = torch.arange(decoded.shape[0]) * shift + shift // 2 - window // 2
        inside = (start + window <= before) | (start >= wav.size - after)
        assert inside.sum() >= 5, key
        zeros = torch.full_like(decoded[inside], float(np.log(np.finfo(np.float32).eps)))  # log of the floor
        assert torch.equal(decoded[inside], zeros), key
        assert torch.equal(feats[key][inside], zeros) and torch.equal(on_model[key][inside], zeros), key
        assert (feats[key][~inside] - decoded[~inside]).abs().max() > 0.1, key  # the speech is dithered
        assert (on_model[key] - feats[key]).abs().max() < 2e-3, key
    assert len(sides) == 3  # before, after and both


def test_silence_pad_is_drawn_by_seed_epoch_and_key_the_same_after_a_resume_and_off_at_prob_0(data, clean, tmp_path):
    conf = {"silence_pad": True, "volume_perturb": True}
    dump(data, tmp_path / "a", epoch=2, **conf)
    dump(data, tmp_path / "b", epoch=2, num_workers=2, **conf)  # other workers, other batches: the same draws
    dump(data, tmp_path / "e3", epoch=3, **conf)
    names = sorted(p.name for p in (tmp_path / "a").glob("*.wav"))
    assert names and names == sorted(p.name for p in (tmp_path / "b").glob("*.wav"))
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)
    draws = {d: sorted((tmp_path / d / "draws.jsonl").read_text().splitlines()) for d in ("a", "b", "e3")}
    assert draws["a"] == draws["b"] != draws["e3"]
    padded = sum('"silence"' in line for line in draws["a"])
    assert 0 < padded < len(names)  # the default prob: some utterances, not all
    seen, rest = resumed(data, tmp_path / "rest", **conf)
    assert seen and rest and sorted(seen + rest) == sorted(p.stem for p in (tmp_path / "a").glob("*.wav"))
    for key in rest:
        assert (tmp_path / "rest" / f"{key}.wav").read_bytes() == (tmp_path / "a" / f"{key}.wav").read_bytes()
    off = dump(data, tmp_path / "off", silence_pad=True, silence_pad_conf__prob=0.0)
    assert sorted(off) == sorted(clean) and all(np.array_equal(off[k], clean[k]) for k in clean)
    assert '"silence"' not in (tmp_path / "off" / "draws.jsonl").read_text()


def test_silence_pad_joins_the_training_chain_not_the_eval_chain():
    """The espeak recipe's conf with silence_pad on (off there for now, docs/TRAINING.md): the stage pads training
    utterances only; cv and decode read the audio as it is."""
    import yaml

    from corpus_io.config.compose import validate

    raw = yaml.safe_load((REPO / "recipes" / "espeak" / "conf" / "train.yaml").read_text())
    conf = validate(DatasetConf, {**raw["dataset_conf"], "silence_pad": True})
    assert conf.silence_pad_conf.prob > 0 and conf.silence_pad_conf.seconds[1] >= 0.8
    assert "silence_pad(" in describe_chain(loader_chain(conf, None, train=True))
    assert "silence_pad(" not in describe_chain(loader_chain(conf, None, train=False))
