"""The loader's schema (``dataset_conf`` and its blocks) and the tokenizer's: shared by train, decode,
compute-cmvn, bench-loader and add-field."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from corpus_io.config.checks import schema
from corpus_io.config.fields import allow_pipe_opt, on_error_opt, opt, pipe_timeout_opt, storage_options_opt
from corpus_io.errors import ConfigError


@schema
class FilterConf:
    max_length: int = opt(10240, "drop utterances longer than this", unit="frames (10 ms)", range="[1, 1000000000]")
    min_length: int = opt(10, "drop utterances shorter than this", unit="frames (10 ms)", range="[0, 1000000000]")
    token_max_length: int = opt(200, "drop utterances with more tokens than this", unit="tokens",
                                range="[1, 1000000000]")
    token_min_length: int = opt(1, "drop utterances with fewer tokens than this", unit="tokens",
                                range="[0, 1000000000]")
    min_output_input_ratio: float = opt(0.0005, "drop if tokens/frames is below this", unit="tokens per frame",
                                        range="[0, inf)")
    max_output_input_ratio: float = opt(1.0, "drop if tokens/frames is above this", unit="tokens per frame",
                                        range="(0, inf)")


@schema
class ResampleConf:
    resample_rate: int = opt(16000, "every waveform is resampled to this rate", unit="Hz", range="[1000, 384000]")


@schema
class SpeedPerturbConf:
    speeds: List[float] = opt(help="one speed factor is drawn per utterance (0.5: half speed, twice as long)",
                              factory=lambda: [0.9, 1.0, 1.1], range="[0.1, 10]", min_items=1)


@schema
class NoiseSetConf:
    noise_list: str = opt("???", "a noise list: any input the commands read (wav.scp, Kaldi dir, JSONL, Lhotse, "
                                 "or a shard data.list), local or remote")
    weight: float = opt(1.0, "relative share of utterances that draw their noise from this set", range="[0, inf)")
    snr_db: Optional[List[float]] = opt(None, "[low, high] SNR of this set (null: add_noise_conf.snr_db)",
                                        unit="dB", range="[-50, 100]")


@schema
class AddNoiseConf:
    noise_list: Optional[str] = opt(None, "a noise list: any input the commands read (wav.scp, Kaldi dir, JSONL, "
                                          "Lhotse, or a shard data.list), local or remote; or use sets")
    snr_db: List[float] = opt(help="[low, high]: the SNR of each noisy utterance is drawn uniformly in it, measured on "
                                   "the speech's active samples", factory=lambda: [5.0, 20.0], unit="dB",
                              range="[-50, 100]", min_items=2)
    prob: float = opt(1.0, "share of utterances that get noise", range="[0, 1]")
    sets: List[NoiseSetConf] = opt(help="several noise sets drawn by weight (e.g. MUSAN music/noise/babble): "
                                        "[{noise_list, weight, snr_db}]", factory=list)
    buffer_seconds: float = opt(300.0, "noise each loader worker holds per set and epoch: a window of the list read "
                                       "sequentially, chosen by (seed, epoch); utterances draw from it",
                                unit="seconds", range="(0, 86400]")


@schema
class AddReverbConf:
    rir_list: Optional[str] = opt(None, "a list of room impulse responses: any input the commands read (wav.scp, "
                                        "Kaldi dir, JSONL, or a shard data.list)")
    prob: float = opt(0.5, "share of utterances that get reverberation", range="[0, 1]")
    buffer_seconds: float = opt(60.0, "impulse responses each loader worker holds per epoch (a window of the list "
                                      "chosen by (seed, epoch))", unit="seconds", range="(0, 86400]")


@schema
class VolumePerturbConf:
    gain_db: List[float] = opt(help="[low, high]: a gain drawn uniformly per utterance (a peak above full scale is "
                                    "scaled down)", factory=lambda: [-6.0, 6.0], unit="dB", range="[-60, 60]",
                               min_items=2)


@schema
class SilencePadConf:
    prob: float = opt(0.5, "share of utterances padded with digital silence (exact zeros) before the speech, after "
                           "it or both (one of the three drawn alike)", range="[0, 1]")
    seconds: List[float] = opt(help="[low, high]: each padded side's length, drawn uniformly in it (sherpa-onnx's "
                                    "online tool pads 0.5 s before and 0.8 s after)", factory=lambda: [0.1, 1.0],
                               unit="seconds", range="[0, 60]", min_items=2)


@schema
class FbankConf:
    num_mel_bins: int = opt(80, "mel filterbank channels (Kaldi needs at least 4)", range="[4, 512]")
    frame_length: float = opt(25.0, "analysis window", unit="ms", range="[1, 1000]")
    frame_shift: float = opt(10.0, "hop between frames", unit="ms", range="[1, 1000]")
    dither: float = opt(1.0, "Gaussian dither added before the FFT in training, on the 16-bit sample scale (1: one "
                             "step, WeNet's and sherpa-onnx's; drawn by (seed, epoch, key)); cv, decode, "
                             "compute-cmvn and export use 0. 0: deterministic training features",
                        range="[0, inf)")
    low_freq: float = opt(20.0, "low cutoff, below the high cutoff", unit="Hz", range="[0, 192000)")
    high_freq: float = opt(-400.0, "high cutoff (<= 0: offset from Nyquist, 0 = Nyquist; -400 is sherpa-onnx's, "
                                   "kaldi-native-fbank's and Lhotse's default); low_freq < high cutoff <= Nyquist",
                           unit="Hz", range="(-192000, 192000]")  # -192000: no band even at 384 kHz
    snip_edges: bool = opt(False, "true: only frames that fit in the audio, frame k from sample k * shift (Kaldi's "
                                  "and WeNet's default); false: a frame centred on every shift, (n + shift/2) // "
                                  "shift of them, the samples past either end reflected (kaldi-native-fbank's, "
                                  "sherpa-onnx's and Lhotse's default: with high_freq=-400 their features exactly)")


@schema
class MfccConf:
    num_mel_bins: int = opt(40, "mel filterbank channels (Kaldi needs at least 4)", range="[4, 512]")
    num_ceps: int = opt(40, "cepstral coefficients kept (at most num_mel_bins)", range="[1, 512]")
    frame_length: float = opt(25.0, "analysis window", unit="ms", range="[1, 1000]")
    frame_shift: float = opt(10.0, "hop between frames", unit="ms", range="[1, 1000]")
    dither: float = opt(1.0, "Gaussian dither added before the FFT in training, on the 16-bit sample scale (drawn "
                             "by (seed, epoch, key)); cv, decode, compute-cmvn and export use 0", range="[0, inf)")
    high_freq: float = opt(-200.0, "high cutoff (<= 0: offset from Nyquist); low_freq < high cutoff <= Nyquist",
                           unit="Hz", range="(-192000, 192000]")  # -192000: no band even at 384 kHz
    low_freq: float = opt(20.0, "low cutoff, below the high cutoff", unit="Hz", range="[0, 192000)")


@schema
class SpecAugConf:
    num_t_mask: int = opt(2, "time masks per utterance", range="[0, 100]")
    num_f_mask: int = opt(2, "frequency masks per utterance", range="[0, 100]")
    max_t: int = opt(50, "longest time mask (num_t_mask=0: none)", unit="frames", range="[1, 100000]")
    max_f: int = opt(10, "widest frequency mask (num_f_mask=0: none)", unit="mel bins", range="[1, 512]")


@schema
class SpecSubConf:
    max_t: int = opt(30, "longest substituted span (num_t_sub=0: none)", unit="frames", range="[1, 100000]")
    num_t_sub: int = opt(3, "substitutions per utterance", range="[0, 100]")


@schema
class SpecTrimConf:
    max_t: int = opt(20, "most frames trimmed from the end (spec_trim=false: none)", unit="frames",
                     range="[1, 100000]")


@schema
class ShuffleConf:
    shuffle_size: int = opt(1500, "utterances held by the shuffle buffer", unit="utterances", range="[1, 1000000]")


@schema
class SortConf:
    sort_size: int = opt(500, "utterances sorted by length together", unit="utterances", range="[1, 1000000]")


@schema
class SourceConf:
    data_list: str = opt("???", "a data.list (shard or raw) of one corpus")
    weight: float = opt(1.0, "relative share of this corpus in the mix", range="[0, inf)")
    data_type: str = opt("shard", "format of this list", choices=("raw", "shard"))


@schema
class DatasetConf:
    data_type: str = opt("shard", "raw: JSONL list of utterances; shard: list of tar URLs", choices=("raw", "shard"))
    fields: List[str] = opt(help="fields to read (empty: all of the main shard), e.g. [fbank, txt]", factory=list)
    seed: int = opt(777, "seed of the list shuffle and the buffers; epoch e uses (seed, e)", range="[0, 4294967295]")
    filter_conf: FilterConf = opt(factory=FilterConf)
    resample_conf: ResampleConf = opt(factory=ResampleConf)
    speed_perturb: bool = opt(False, "apply speed perturbation (train only)")
    speed_perturb_conf: SpeedPerturbConf = opt(factory=SpeedPerturbConf)
    add_reverb: bool = opt(False, "convolve with a room impulse response drawn by (seed, epoch, key) (train only; "
                                  "after speed_perturb)")
    add_reverb_conf: AddReverbConf = opt(factory=AddReverbConf)
    add_noise: bool = opt(False, "mix in noise drawn by (seed, epoch, key) at a drawn SNR (train only; after "
                                 "add_reverb)")
    add_noise_conf: AddNoiseConf = opt(factory=AddNoiseConf)
    volume_perturb: bool = opt(False, "scale by a gain drawn by (seed, epoch, key) (train only; after add_noise)")
    volume_perturb_conf: VolumePerturbConf = opt(factory=VolumePerturbConf)
    silence_pad: bool = opt(False, "pad utterances with digital silence drawn by (seed, epoch, key), exact zeros that "
                                   "the training dither leaves alone: the zeros runtimes pad with (train only; after "
                                   "volume_perturb)")
    silence_pad_conf: SilencePadConf = opt(factory=SilencePadConf)
    feats_type: str = opt("fbank", "features computed by the loader",
                          choices=("fbank", "mfcc", "raw", "precomputed"))
    feats_on: str = opt("auto", "where fbank/mfcc and spec_aug/sub/trim run: loader (DataLoader workers, per "
                                "utterance), model (the loader ships padded waveforms; train/cv/decode compute them "
                                "batched on the model's device), or auto: model when training on CUDA, else loader",
                        choices=("auto", "loader", "model"))
    fbank_conf: FbankConf = opt(factory=FbankConf)
    mfcc_conf: MfccConf = opt(factory=MfccConf)
    spec_aug: bool = opt(False, "SpecAugment masks (train only)")
    spec_aug_conf: SpecAugConf = opt(factory=SpecAugConf)
    spec_sub: bool = opt(False, "substitute time spans with earlier frames (train only)")
    spec_sub_conf: SpecSubConf = opt(factory=SpecSubConf)
    spec_trim: bool = opt(False, "trim a random number of end frames (train only)")
    spec_trim_conf: SpecTrimConf = opt(factory=SpecTrimConf)
    shuffle: bool = opt(True, "shuffle the list per epoch and shuffle utterances in a buffer")
    shuffle_conf: ShuffleConf = opt(factory=ShuffleConf)
    sort: bool = opt(True, "sort utterances by length inside a buffer before batching")
    sort_conf: SortConf = opt(factory=SortConf)
    bucketing: bool = opt(True, "batch from duration buckets, each batch padded to its bucket's edge (few shapes, "
                                "little padding: see docs/TRAINING.md 'Training on GPUs'); false: the sort buffer, "
                                "each batch padded to its longest utterance")
    num_buckets: int = opt(30, "duration buckets when bucketing=true: an epoch has at most num_buckets + 1 padded "
                               "lengths; memory: one batch per bucket is held", range="[1, 1000]")
    bucket_edges: Optional[List[float]] = opt(None, "upper bucket edges (ascending); default: estimated from the data "
                                                    "(the shard index's durations, or the first bucket_sample "
                                                    "utterances) to pad least", unit="seconds", range="(0, 86400]")
    bucket_batch_size: Optional[List[int]] = opt(None, "a batch_size per bucket, one per bucket_edges entry (which it "
                                                       "needs), in batch_type's unit (lhotse's per-bucket batch sizes: "
                                                       "as many long utterances as fit, more short ones)",
                                                 unit="utterances | frames | frames+tokens", range="[1, 100000000]")
    sync_buckets: bool = opt(True, "buckets take turns by one schedule on every rank and worker, so DDP ranks step "
                                   "on batches of the same padded length (lhotse's sync_buckets)")
    bucket_shares: Optional[List[float]] = opt(None, "each bucket's share of the utterances, for the sync_buckets "
                                                     "schedule; default: from the durations, with the edges",
                                               range="[0, 1]")
    bucket_sample: int = opt(2000, "utterances read (per list) to estimate bucket edges when the index holds no "
                                   "durations (raw lists, older indexes)", unit="utterances", range="[1, 10000000]")
    batch_type: str = opt("example", "example: utterances; length: padded frames; token: padded frames+tokens",
                          choices=("example", "length", "token"))
    batch_size: int = opt(16, "example: utterances per batch; length: max(source_len)*n; "
                              "token: max(source_len+target_len)*n", unit="utterances | frames | frames+tokens",
                          range="[1, 100000000]")
    max_batch_size: int = opt(200, "cap on utterances per batch for length/token batching", unit="utterances",
                              range="[1, 100000]")
    num_workers: int = opt(2, "DataLoader worker processes per rank", range="[0, 256]")
    prefetch: int = opt(2, "batches prefetched per worker", range="[1, 64]")
    batch_timeout: float = opt(1800.0, "longest wait for the next batch of a DataLoader worker; past it the rank "
                                       "fails naming the rank and worker (0: wait forever)", unit="seconds",
                               range="[0, 604800]")
    worker_start_method: str = opt("forkserver", "how DataLoader workers start: forkserver (forked from one helper "
                                                 "process without threads: safe beside TensorBoard's and gloo's "
                                                 "threads, cheap; the helper is a fork of this process while it "
                                                 "runs no other thread, sharing its torch), spawn (a fresh "
                                                 "interpreter each), fork (a copy of this process: can deadlock "
                                                 "when it has threads)",
                                   choices=("forkserver", "spawn", "fork"))
    worker_start_timeout: float = opt(120.0, "longest wait for a DataLoader worker to start; past it the rank fails "
                                             "naming rank, loader and epoch (every rank of a training says it)",
                                      unit="seconds", range="(0, 86400]")
    pin_memory: Optional[bool] = opt(None, "pin batches in page-locked memory; default (null): on when training on "
                                           "CUDA")
    on_error: str = on_error_opt("a corrupt shard/member or an unreachable URL: fail, or skip and count it")
    retries: int = opt(3, "attempts to open a remote URL before on_error applies", range="[0, 100]")
    retry_backoff: float = opt(0.5, "first wait between retries, doubled each time", unit="seconds", range="[0, 600]")
    read_timeout: float = opt(30.0, "longest wait for a connection or the next byte of a remote read, per "
                                    "attempt; a stall past it is retried, then on_error", unit="seconds",
                              range="(0, 86400]")
    max_member_bytes: int = opt(256 * 1024 * 1024, "a tar member larger than this is rejected", unit="bytes",
                                range="[1, 17179869184]")
    storage_options: Dict[str, Any] = storage_options_opt("remote URLs (e.g. endpoint_url, key, secret)")
    allow_pipe: bool = allow_pipe_opt("allow pipe:CMD URLs in lists (runs CMD without a shell)")
    pipe_timeout: float = pipe_timeout_opt()
    sources: List[SourceConf] = opt(help="mix several lists by weight: [{data_list, weight, data_type}]",
                                    factory=list)
    epoch_hours: Optional[float] = opt(None, "define an epoch as this much audio instead of one pass", unit="hours",
                                       range="(0, inf)")

    def check_together(self, prefix: str) -> None:
        """Limits that join two keys (Kaldi's mfcc asserts them; the range of each key alone cannot)."""
        self._check_waveform_augmentation(prefix)
        if self.feats_type not in ("fbank", "mfcc"):
            return
        nyquist = self.resample_conf.resample_rate / 2
        m = self.mfcc_conf if self.feats_type == "mfcc" else self.fbank_conf
        block = f"{prefix}{self.feats_type}_conf"
        if self.feats_type == "mfcc" and m.num_ceps > m.num_mel_bins:
            raise ConfigError(f"{prefix}mfcc_conf.num_ceps={m.num_ceps} is more than {prefix}mfcc_conf.num_mel_bins="
                              f"{m.num_mel_bins}; Kaldi's mfcc keeps at most one cepstrum per mel bin. Lower "
                              f"++{prefix}mfcc_conf.num_ceps or raise num_mel_bins.")
        high = m.high_freq if m.high_freq > 0 else nyquist + m.high_freq
        if not m.low_freq < high <= nyquist:
            raise ConfigError(f"{block}.low_freq={m.low_freq} and high_freq={m.high_freq} give the band "
                              f"[{m.low_freq}, {high}] Hz, but at {prefix}resample_conf.resample_rate="
                              f"{self.resample_conf.resample_rate} it must lie inside (0, {nyquist}] and not be empty. "
                              f"Change ++{block}.low_freq / ++{block}.high_freq.")

    def _check_waveform_augmentation(self, prefix: str) -> None:
        ranges = [(f"{prefix}volume_perturb_conf.gain_db", self.volume_perturb_conf.gain_db),
                  (f"{prefix}add_noise_conf.snr_db", self.add_noise_conf.snr_db),
                  (f"{prefix}silence_pad_conf.seconds", self.silence_pad_conf.seconds)]
        ranges += [(f"{prefix}add_noise_conf.sets[{i}].snr_db", s.snr_db)
                   for i, s in enumerate(self.add_noise_conf.sets) if s.snr_db is not None]
        for name, pair in ranges:
            if len(pair) != 2 or pair[0] > pair[1]:
                raise ConfigError(f"{name}={list(pair)} must be [low, high] with low <= high, e.g. ++{name}=[5,20].")
        if self.feats_type in ("raw", "precomputed") and (self.add_noise or self.add_reverb or self.volume_perturb
                                                           or self.silence_pad):
            raise ConfigError(f"{prefix}add_noise, add_reverb, volume_perturb and silence_pad change the waveform "
                              f"before features, "
                              f"but {prefix}feats_type={self.feats_type} has none to change; use fbank or mfcc, or "
                              f"turn them off.")
        if self.add_noise:
            conf = self.add_noise_conf
            if bool(conf.noise_list) == bool(conf.sets):
                raise ConfigError(f"{prefix}add_noise=true needs the noise: ++{prefix}add_noise_conf.noise_list=LIST "
                                  f"(a wav.scp, Kaldi dir, JSONL or shard data.list) or add_noise_conf.sets="
                                  f"[{{noise_list, weight}}], not both.")
            if conf.sets and not sum(s.weight for s in conf.sets) > 0:
                raise ConfigError(f"{prefix}add_noise_conf.sets: every weight is 0, so no set can be drawn; give one "
                                  f"a weight > 0.")
        if self.add_reverb and not self.add_reverb_conf.rir_list:
            raise ConfigError(f"{prefix}add_reverb=true needs ++{prefix}add_reverb_conf.rir_list=LIST (a wav.scp, "
                              f"Kaldi dir, JSONL or shard data.list of impulse responses; recipes/tools/make_rirs.py "
                              f"simulates a set).")


#: the dataset_conf keys that make a model's features (a checkpoint's own: fine-tuning warns, decoding refuses others)
FEATURE_KEYS = ("feats_type", "fbank_conf", "mfcc_conf", "resample_conf")
#: feature settings that differ between training and decoding by design
NOT_FEATURES = ("dither",)

#: the feature settings of configs saved before sherpa-onnx's features and training-time dither became the defaults
#: (issue 52): a checkpoint's or an export's config that lacks one of these keys was trained with this value
SAVED_FEATURE_DEFAULTS = {"fbank_conf": {"dither": 0.0, "high_freq": 0.0, "snip_edges": True},
                          "mfcc_conf": {"dither": 0.0}}


def saved_features(config: Any) -> Any:
    """A saved training config (the plain dict a checkpoint or an export carries) with every feature key it lacks
    set to the value it was trained with (:data:`SAVED_FEATURE_DEFAULTS`), not today's default: an old model keeps
    its features. A config that names a key keeps it; anything but a dict is returned as it is."""
    if not isinstance(config, dict) or not isinstance(config.get("dataset_conf", {}), dict):
        return config
    dataset = dict(config.get("dataset_conf") or {})
    for block, keys in SAVED_FEATURE_DEFAULTS.items():
        given = dataset.get(block)
        if given is None or isinstance(given, dict):
            dataset[block] = {**keys, **(given or {})}
    return {**config, "dataset_conf": dataset}


# --------------------------------------------------------------------------- tokenizer


@schema
class TokenizerConf:
    type: str = opt("char", "char: CJK chars + Latin words/letters; bpe: sentencepiece; word: jieba + whitespace",
                    choices=("char", "bpe", "word"))
    token_list: Optional[str] = opt(None, "token list file: '<token> <id>' per line")
    bpe_model: Optional[str] = opt(None, "sentencepiece model (type=bpe)")
    latin_unit: str = opt("word", "how char splits Latin text", choices=("word", "letter"))
    remove_cjk_spaces: bool = opt(True, "drop spaces between CJK characters before tokenizing")
    lowercase: bool = opt(False, "lowercase text before tokenizing")
    unk: str = opt("<unk>", "symbol for unknown tokens")
    blank: str = opt("<blank>", "CTC blank symbol (id 0)")
    space: str = opt("▁", "symbol for a word boundary when latin_unit=letter")

