"""CTC models of other toolkits as the ``++checkpoint=`` of decode, align, segment and score: one door.

A CTC model is what these commands need of it: log-probabilities per frame, its frame rate, its token list (the
blank first) and how text becomes its tokens. :func:`load_foreign` gives them for

* a Hugging Face CTC model directory (``config.json``, the weights, the processor's files: wav2vec2, HuBERT, MMS,
  XLS-R, ...), through ``transformers`` (the ``[hf]`` extra): the model's own feature extractor (its sampling rate
  and normalisation) and tokenizer (its word delimiter ``|``, its vocabulary's case);
* a sherpa-onnx CTC model file (``model.onnx`` with ``tokens.txt`` beside it and without corpus-io's own metadata,
  or named ``sherpa-onnx:model.onnx``): ``model_type`` ``wenet_ctc`` (samples scaled to 16-bit values) and
  ``zipformer2_ctc`` (samples in [-1, 1]), fbank computed by kaldi-native-fbank as sherpa-onnx computes it for that
  type (80 bins or the file's ``feature_dim``, 25/10 ms povey frames centred on each shift, dither 0), and NeMo's
  exports (``EncDecCTCModelBPE``, ...: sherpa-onnx's ``nemo_ctc``; hann frames, librosa mel banks, log(x + 2^-24),
  ``normalize_type`` ``per_feature``: each bin normalised over the utterance);
* torchaudio's ``MMS_FA`` (``torchaudio:MMS_FA``, weights from torchaudio's cache, or
  ``torchaudio:MMS_FA:/path/model.pt``): 1,130 languages' romanised text (``uroman``) as 27 lowercase letters.

behind the interface of an exported corpus-io model (:mod:`corpus_io.infer.exported`): ``model(waveforms,
lengths) -> (log_probs, lengths)``, ``inputs == "waveform"``, plus ``frame_seconds`` (its output frame, 20 ms for
wav2vec2): word times follow its Viterbi path at that rate, with no move to the fbank's speech onsets and no frame
offset (those are corpus-io's own models' rule). Each utterance (or ``chunk_seconds`` piece) goes through the model
alone: padding changes a group-norm wav2vec2's outputs, and the model's library gives what it gives on one.

Text is made fit for the vocabulary (:class:`VocabTokenizer`, the rule of docs/DECODING.md "Models of other
toolkits"; a command's ``text_rule.case`` and ``text_rule.punctuation`` override it): its case follows the
vocabulary's letters (all lowercase: lowercased; all uppercase: uppercased), a punctuation or symbol character the
vocabulary lacks is left out of the word's tokens (the apostrophe stays where the vocabulary has it), and a word with
a character it still cannot spell (a digit, a letter of another script) has no tokens: align and segment report it
unaligned (``tokens outside the token list``), never drop it.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Any

import torch

from corpus_io.errors import ConfigError
from corpus_io.tokenizer import Tokenizer

TORCHAUDIO = "torchaudio:"
SHERPA = "sherpa-onnx:"
#: torchaudio bundles that are CTC aligners/recognisers with a character vocabulary
TORCHAUDIO_BUNDLES = ("MMS_FA",)
#: the fbank sherpa-onnx computes for a CTC file by default (kaldi-native-fbank's options: FeatureExtractorConfig)
_FBANK = {"scale": 1.0, "window_type": "povey", "remove_dc_offset": True, "low_freq": 20.0, "high_freq": -400.0,
          "is_librosa": False, "log_floor": True, "eps": None}
#: NeMo's files (offline-recognizer-ctc-impl.h: hann window, no DC removal, librosa mel banks over 0 Hz to Nyquist;
#: features.cc: log(x + 2^-24), NeMo's log_zero_guard; preemphasis stays kaldi-native-fbank's 0.97)
_NEMO = {**_FBANK, "window_type": "hann", "remove_dc_offset": False, "low_freq": 0.0, "high_freq": 0.0,
         "is_librosa": True, "log_floor": False, "eps": 2.0 ** -24, "nemo": True}
#: the ``model_type`` values of sherpa-onnx CTC files read here, with the features sherpa-onnx computes for them
#: (``scale``: wenet_ctc's samples as 16-bit values). NeMo's exports name their class (EncDecCTCModelBPE, ...).
SHERPA_TYPES = {"wenet_ctc": {**_FBANK, "scale": 32768.0}, "zipformer2_ctc": _FBANK,
                **{name: _NEMO for name in ("nemo_ctc", "EncDecCTCModelBPE", "EncDecCTCModel",
                                            "EncDecHybridRNNTCTCBPEModel")}}
#: sherpa-onnx's names of the CTC blank in tokens.txt, in the order its recognizer looks for them
SHERPA_BLANKS = ("<blk>", "<eps>", "<blank>")
CASES = ("auto", "lower", "upper", "keep")
#: what becomes of a punctuation or symbol character (VocabSplit): auto: left out where the vocabulary lacks it;
#: drop: always left out; keep: never (a word with one the vocabulary lacks is outside it, reported)
PUNCTUATION = ("auto", "drop", "keep")


def foreign_kind(checkpoint: str) -> str | None:
    """``"hf"``, ``"sherpa-onnx"``, ``"torchaudio"`` or None (a corpus-io checkpoint or export)."""
    name = str(checkpoint)
    if name.startswith(TORCHAUDIO):
        return "torchaudio"
    if name.startswith(SHERPA):
        return "sherpa-onnx"
    if os.path.isdir(name) and os.path.isfile(os.path.join(name, "config.json")):
        return "hf"
    if name.lower().endswith(".onnx") and os.path.isfile(name) and \
            os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(name)), "tokens.txt")):
        import onnx

        try:
            meta = {p.key: p.value for p in onnx.load(name, load_external_data=False).metadata_props}
        except Exception:  # noqa: BLE001  (not readable as ONNX: the exported-file door says so)
            return None
        if "corpus_io.format" not in meta:
            return "sherpa-onnx"
    return None


def checkpoint_files(checkpoint: str) -> list[str]:
    """The files a checkpoint is read from (what a job's fingerprint digests): a file, a directory's files, a
    torchaudio bundle's weights file when one is named."""
    kind = foreign_kind(checkpoint)
    name = str(checkpoint)
    if kind == "hf":
        return sorted(str(p) for p in Path(name).iterdir() if p.is_file())
    if kind == "torchaudio":
        weights = name[len(TORCHAUDIO):].partition(":")[2]
        return [weights] if weights else []
    if kind == "sherpa-onnx":
        path = name[len(SHERPA):] if name.startswith(SHERPA) else name
        return [path, os.path.join(os.path.dirname(os.path.abspath(path)), "tokens.txt")]
    return [name]


# --------------------------------------------------------------------------- text -> the vocabulary's tokens


class VocabSplit:
    """Text (one or more words, whitespace between) as a vocabulary's tokens: each word's characters by longest
    match (a word-initial ``▁`` piece first, sherpa-onnx's BPE and word lists), punctuation and symbols the
    vocabulary lacks left out, the word delimiter (``|``, or ``▁`` for letter lists) between words. A character no
    token spells stays as itself: the caller's ``token_id`` is None for it (the word is outside the list)."""

    def __init__(self, vocab: set[str], delimiter: str | None, punctuation: str = "auto") -> None:
        self.vocab = vocab
        self.delimiter = delimiter
        self.punctuation = punctuation
        self.longest = max((len(t) for t in vocab), default=1)
        # a BPE list (▁-initial pieces): a word no ▁ piece starts begins with the lone ▁, as sentencepiece spells it
        self.mark = "▁" if delimiter is None and "▁" in vocab and \
            any(t.startswith("▁") and len(t) > 1 for t in vocab) else None

    def kept(self, c: str) -> bool:
        """Whether character ``c`` stays in a word's tokens (:data:`PUNCTUATION`)."""
        if self.punctuation == "keep" or unicodedata.category(c)[0] not in "PS":
            return True
        return self.punctuation == "auto" and c in self.vocab

    def word(self, word: str) -> list[str]:
        chars = "".join(c for c in word if self.kept(c))
        out: list[str] = []
        i = 0
        while i < len(chars):
            for n in range(min(self.longest, len(chars) - i), 0, -1):
                piece = chars[i:i + n]
                if i == 0 and "▁" + piece in self.vocab:
                    out.append("▁" + piece)
                    break
                if i == 0 and self.mark and n == 1:  # no ▁ piece starts the word
                    out.append(self.mark)
                if piece in self.vocab:
                    out.append(piece)
                    break
            else:
                n = 1
                out.append(chars[i])
            i += n
        return out

    def __call__(self, text: str) -> list[str]:
        out: list[str] = []
        for word in text.split():
            tokens = self.word(word)
            if not tokens:
                continue
            if out and self.delimiter:
                out.append(self.delimiter)
            out.extend(tokens)
        return out


class VocabJoin:
    """Tokens back to text: the word delimiter and ``▁`` as spaces, whitespace collapsed (what transformers'
    ``batch_decode`` and sherpa-onnx's recognizer print)."""

    def __init__(self, delimiter: str | None) -> None:
        self.delimiter = delimiter

    def __call__(self, tokens: list[str]) -> str:
        text = "".join(" " if t == self.delimiter else t for t in tokens).replace("▁", " ")
        return " ".join(text.split())


def vocabulary_case(symbols: list[str]) -> str:
    """``lower``, ``upper`` or ``keep``: the case of the vocabulary's cased letters (single-letter tokens)."""
    letters = [s for s in symbols if len(s) == 1 and s.isalpha() and s.lower() != s.upper()]
    if letters and all(s.islower() for s in letters):
        return "lower"
    if letters and all(s.isupper() for s in letters):
        return "upper"
    return "keep"


class VocabTokenizer(Tokenizer):
    """corpus-io's tokenizer interface over another toolkit's vocabulary (``symbols`` with the blank first):
    :meth:`tokenize` applies the case rule and the vocabulary's units (:class:`VocabSplit`),
    :meth:`decode` the joined text (:class:`VocabJoin`). ``specials``: the vocabulary's reserved symbols (a word
    written as one is outside the list)."""

    def __init__(self, symbols: list[str], *, unk: str | None, delimiter: str | None, specials: set[str],
                 case: str = "auto", punctuation: str = "auto", where: str = "") -> None:
        from corpus_io.config import TokenizerConf

        if case not in CASES:
            raise ConfigError(f"text_rule.case={case!r}: one of {', '.join(CASES)}.")
        if punctuation not in PUNCTUATION:
            raise ConfigError(f"text_rule.punctuation={punctuation!r}: one of {', '.join(PUNCTUATION)}.")
        self.symbols = list(symbols)
        self.ids = {s: i for i, s in enumerate(self.symbols)}
        self.conf = TokenizerConf(type="char", latin_unit="letter", space=delimiter or "▁", blank=self.symbols[0],
                                  unk=unk if unk in self.ids else self.symbols[0], lowercase=False)
        self.case = vocabulary_case(self.symbols) if case == "auto" else case
        self.delimiter = delimiter
        plain = {s for s in self.symbols[1:] if s not in specials or s == delimiter}
        self._split = VocabSplit(plain | ({delimiter} if delimiter else set()), delimiter, punctuation)
        self._join = VocabJoin(delimiter)
        self.blank_id = 0
        self.unk_id = self.ids.get(unk, 0) if unk else 0
        self.sos_eos_id = 0  # no sentence symbol: decode skips the blank alone
        self.specials = frozenset((specials - {delimiter}) | {self.symbols[0]})  # the delimiter spells text
        self.num_tokens = 0
        self.num_unknown = 0
        self._rebuild = None
        self.where = where

    def normalize(self, text: str) -> str:
        """The transcript's words as written (align and segment report them so); the case rule applies when a word
        becomes tokens (:meth:`tokenize`)."""
        return unicodedata.normalize("NFC", text).strip()

    def tokenize(self, text: str) -> list[str]:
        text = self.normalize(text)
        if self.case == "lower":
            text = text.lower()
        elif self.case == "upper":
            text = text.upper()
        return self._split(text)

    def decode(self, ids: Any) -> str:
        return self._join([self.symbols[i] for i in ids if i != self.blank_id])


def blank_first(symbols: list[str], blank: int) -> tuple[list[str], list[int]]:
    """The symbols with the blank moved to id 0 and the column order that gives the model's log-probs that order
    (corpus-io's searches and aligners take the blank as id 0)."""
    order = [blank] + [i for i in range(len(symbols)) if i != blank]
    return [symbols[i] for i in order], order


# --------------------------------------------------------------------------- the models


class ForeignCTC:
    """A CTC model of another toolkit behind an exported model's interface (module doc): waveforms in, log-probs with
    the blank first out, one utterance at a time. Subclasses give :meth:`row` (a 1-D float waveform in [-1, 1] at
    ``sample_rate`` -> (T, V) log-probs in the model's own column order)."""

    inputs = "waveform"

    def __init__(self, order: list[int], frame_seconds: float, sample_rate: int, device: Any, what: str) -> None:
        self.order = torch.tensor(order, dtype=torch.long)
        self.frame_seconds = frame_seconds
        self.sample_rate = sample_rate
        self.device = torch.device(device)
        self.what = what

    def row(self, wave: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.float() / 32768.0 if x.dtype == torch.int16 else x.float()
        rows = []
        with torch.no_grad():
            for i, n in enumerate(lengths.tolist()):
                lp = self.row(x[i, : int(n)].detach().cpu()).float().cpu()
                rows.append(lp[:, self.order.to(lp.device)])
        out_lengths = torch.tensor([r.shape[0] for r in rows], dtype=torch.long)
        width = max(1, int(out_lengths.max())) if rows else 1
        out = rows[0].new_zeros((len(rows), width, rows[0].shape[1])) if rows else torch.zeros(0, 1, 1)
        for i, r in enumerate(rows):
            out[i, : r.shape[0]] = r
        return out.to(self.device), out_lengths.to(self.device)

    def front_end(self, batch: dict, *, train: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["wav"], batch["wav_lengths"]


class HuggingFaceCTC(ForeignCTC):
    """A transformers ``AutoModelForCTC`` with its processor's feature extractor (normalisation per utterance)."""

    def __init__(self, model: Any, extractor: Any, order: list[int], frame_seconds: float, device: Any,
                 what: str) -> None:
        super().__init__(order, frame_seconds, int(extractor.sampling_rate), device, what)
        self.model = model.to(self.device).eval()
        self.extractor = extractor

    def row(self, wave: torch.Tensor) -> torch.Tensor:
        inputs = self.extractor(wave.numpy(), sampling_rate=self.sample_rate, return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in inputs.items() if k != "attention_mask"}
        logits = self.model(**inputs).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)


class TorchaudioCTC(ForeignCTC):
    """A torchaudio wav2vec2 model extended as its bundle does (waveform normalised, log-softmax applied)."""

    def __init__(self, model: Any, order: list[int], frame_seconds: float, sample_rate: int, device: Any,
                 what: str) -> None:
        super().__init__(order, frame_seconds, sample_rate, device, what)
        self.model = model.to(self.device).eval()

    def row(self, wave: torch.Tensor) -> torch.Tensor:
        emission, _ = self.model(wave[None].to(self.device))
        return emission[0]


class SherpaOnnxCTC(ForeignCTC):
    """A sherpa-onnx offline CTC file run by onnxruntime on kaldi-native-fbank features computed as sherpa-onnx
    computes them for its ``model_type`` (``profile``: :data:`SHERPA_TYPES`). A NeMo file takes the features
    normalised per mel bin over the utterance (``normalize`` ``per_feature``), as (1, bins, T), and gives T //
    ``subsampling`` frames."""

    def __init__(self, session: Any, profile: dict, feature_dim: int, order: list[int], frame_seconds: float,
                 device: Any, what: str, *, normalize: str = "", subsampling: int = 4) -> None:
        super().__init__(order, frame_seconds, 16000, device, what)
        self.session = session
        self.scale = float(profile["scale"])
        self.nemo = bool(profile.get("nemo"))
        self.normalize = normalize
        self.subsampling = max(1, int(subsampling))
        self.names = [i.name for i in session.get_inputs()]
        import kaldi_native_fbank as knf

        opts = knf.FbankOptions()
        opts.frame_opts.dither = 0.0
        opts.frame_opts.snip_edges = False
        opts.frame_opts.samp_freq = 16000
        opts.frame_opts.frame_shift_ms = 10.0
        opts.frame_opts.frame_length_ms = 25.0
        opts.frame_opts.remove_dc_offset = bool(profile["remove_dc_offset"])
        opts.frame_opts.preemph_coeff = 0.97
        opts.frame_opts.window_type = profile["window_type"]
        opts.mel_opts.num_bins = feature_dim
        opts.mel_opts.low_freq = float(profile["low_freq"])
        opts.mel_opts.high_freq = float(profile["high_freq"])
        opts.mel_opts.is_librosa = bool(profile["is_librosa"])
        opts.use_log_floor = bool(profile["log_floor"])
        if profile["eps"] is not None:
            opts.eps = float(profile["eps"])
        self.options = opts

    def features(self, wave: torch.Tensor) -> Any:
        import kaldi_native_fbank as knf
        import numpy as np

        fbank = knf.OnlineFbank(self.options)
        fbank.accept_waveform(16000, (wave.numpy() * self.scale).tolist())
        fbank.input_finished()
        n = fbank.num_frames_ready
        feats = np.stack([fbank.get_frame(i) for i in range(n)]) if n else \
            np.zeros((0, self.options.mel_opts.num_bins))
        if self.normalize == "per_feature" and n:  # sherpa-onnx's NemoNormalizePerFeature: population std + 1e-5
            mean = feats.mean(axis=0)
            feats = (feats - mean) / (np.sqrt(np.maximum((feats ** 2).mean(axis=0) - mean ** 2, 0.0)) + 1e-5)
        return feats

    def row(self, wave: torch.Tensor) -> torch.Tensor:
        import numpy as np

        feats = self.features(wave).astype(np.float32)
        if feats.shape[0] == 0:
            return torch.zeros(0, len(self.order))
        if self.nemo:  # (1, bins, T) in; T // subsampling frames out, as sherpa-onnx's NeMo model counts them
            out = self.session.run(None, {self.names[0]: np.ascontiguousarray(feats.T[None]),
                                          self.names[1]: np.array([feats.shape[0]], dtype=np.int64)})
            log_probs, lens = torch.from_numpy(out[0])[0], feats.shape[0] // self.subsampling
        else:
            out = self.session.run(None, {self.names[0]: feats[None],
                                          self.names[1]: np.array([feats.shape[0]], dtype=np.int64)})
            log_probs, lens = torch.from_numpy(out[0])[0], int(np.asarray(out[1]).reshape(-1)[0])
        return torch.log_softmax(log_probs[:lens].float(), dim=-1)  # a file's logits or log-probs: log-probs


# --------------------------------------------------------------------------- loading


def foreign_config(sample_rate: int) -> Any:
    """The ``TrainConfig`` decode's dataset_conf is completed from: the loader ships waveforms at the model's rate."""
    from corpus_io.config import TrainConfig

    tcfg = TrainConfig()
    tcfg.dataset_conf.feats_on = "model"
    tcfg.dataset_conf.resample_conf.resample_rate = int(sample_rate)
    return tcfg


def load_foreign(checkpoint: str, device: Any, text_rule: Any = None) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, training config)`` of another toolkit's CTC model (module doc), as ``decode.load_model``
    gives a checkpoint's. ``text_rule``: a :class:`corpus_io.config.TextRuleConf` (``case``, ``punctuation``;
    None: both ``auto``)."""
    kind = foreign_kind(checkpoint)
    rule = (getattr(text_rule, "case", "auto"), getattr(text_rule, "punctuation", "auto"))
    if kind == "hf":
        return _load_hf(checkpoint, device, *rule)
    if kind == "torchaudio":
        return _load_torchaudio(checkpoint, device, *rule)
    if kind == "sherpa-onnx":
        return _load_sherpa(checkpoint, device, *rule)
    raise ConfigError(f"checkpoint {checkpoint} is no model of another toolkit.")


def _load_hf(path: str, device: Any, case: str, punctuation: str) -> tuple[Any, Any, Any]:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        model = transformers.AutoModelForCTC.from_pretrained(path, local_files_only=True)
        processor = transformers.AutoProcessor.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"checkpoint {path}: transformers cannot load a CTC model and its processor from this "
                          f"directory ({' '.join(str(exc).split())[:300]}). Give a directory holding config.json, "
                          f"the weights and the processor's files (preprocessor_config.json, vocab.json, "
                          f"tokenizer_config.json), as save_pretrained writes them.") from None
    extractor = getattr(processor, "feature_extractor", None)
    tok = getattr(processor, "tokenizer", None)
    if extractor is None or tok is None:
        raise ConfigError(f"checkpoint {path}: its processor has no feature extractor and tokenizer (a CTC "
                          f"processor, e.g. Wav2Vec2Processor, has both); save the processor beside the model.")
    vocab = tok.get_vocab()
    size = int(model.config.vocab_size)
    symbols = [f"<unused{i}>" for i in range(size)]
    for token, i in vocab.items():
        if 0 <= int(i) < size:
            symbols[int(i)] = token
    blank = model.config.pad_token_id if model.config.pad_token_id is not None else tok.pad_token_id
    if blank is None:
        raise ConfigError(f"checkpoint {path}: neither config.json nor the tokenizer names the pad token, which "
                          f"is the CTC blank of a transformers CTC model; set pad_token_id in config.json.")
    ordered, order = blank_first(symbols, int(blank))
    specials = {s for s in getattr(tok, "all_special_tokens", []) if s in vocab} | \
        {s for s in ordered if s.startswith("<unused")}
    delimiter = getattr(tok, "word_delimiter_token", None)
    if case == "auto" and getattr(tok, "do_lower_case", False):
        case = "lower"
    tokenizer = VocabTokenizer(ordered, unk=tok.unk_token, delimiter=delimiter if delimiter in vocab else None,
                               specials=specials, case=case, punctuation=punctuation, where=path)
    ratio = getattr(model.config, "inputs_to_logits_ratio", None)
    rate = int(extractor.sampling_rate)
    wrapped = HuggingFaceCTC(model, extractor, order, 0.02, device, f"Hugging Face model {path}")
    if ratio:
        wrapped.frame_seconds = float(ratio) / rate
    else:  # measured: frames of 10 s of silence
        frames = wrapped.row(torch.zeros(10 * rate)).shape[0]
        wrapped.frame_seconds = round(10.0 / max(1, frames), 4)
    return wrapped, tokenizer, foreign_config(rate)


def mms_weights(checkpoint: str, bundle: Any) -> str:
    """The weights file of ``torchaudio:MMS_FA[:path]``: the path given, else torchaudio's download cache (where
    ``bundle.get_model()`` puts it: ``torch.hub.get_dir()/checkpoints/model.pt``)."""
    given = checkpoint[len(TORCHAUDIO):].partition(":")[2]
    if given:
        if not os.path.isfile(given):
            raise ConfigError(f"checkpoint {checkpoint}: {given} does not exist.")
        return given
    cached = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(bundle._path))
    if not os.path.isfile(cached):
        raise ConfigError(f"checkpoint {checkpoint}: the weights are not in torchaudio's cache ({cached}), and "
                          f"nothing is downloaded here. Fetch them once where the network is open (python -c "
                          f"'import torchaudio; torchaudio.pipelines.MMS_FA.get_model()', or download "
                          f"{bundle._path}) and copy the file to {cached}, or name it: "
                          f"torchaudio:MMS_FA:/path/to/model.pt as the checkpoint.")
    return cached


def _load_torchaudio(checkpoint: str, device: Any, case: str, punctuation: str) -> tuple[Any, Any, Any]:
    import torchaudio
    from torchaudio.pipelines._wav2vec2 import utils

    name = checkpoint[len(TORCHAUDIO):].partition(":")[0]
    if name not in TORCHAUDIO_BUNDLES:
        raise ConfigError(f"checkpoint {checkpoint}: torchaudio's CTC bundle here is one of "
                          f"{', '.join(TORCHAUDIO_BUNDLES)} (e.g. torchaudio:MMS_FA).")
    bundle = getattr(torchaudio.pipelines, name)
    path = mms_weights(checkpoint, bundle)
    model = utils._get_model(bundle._model_type, bundle._params)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if getattr(bundle, "_remove_aux_axis", None) and "aux.weight" in state and \
            state["aux.weight"].shape[0] != bundle._params["aux_num_out"]:
        state = utils._remove_aux_axes(state, bundle._remove_aux_axis)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ConfigError(f"checkpoint {checkpoint}: {path} is not {name}'s weights "
                          f"({str(exc).splitlines()[0][:200]}).") from None
    model = utils._extend_model(model, normalize_waveform=bundle._normalize_waveform, apply_log_softmax=True,
                                append_star=False)
    labels = list(bundle.get_labels(star=None))
    symbols, order = blank_first(labels, 0)
    tokenizer = VocabTokenizer(symbols, unk=None, delimiter=None, specials=set(), case=case,
                               punctuation=punctuation, where=checkpoint)
    ratio = 1
    for _, _, stride in bundle._params["extractor_conv_layer_config"]:
        ratio *= stride
    rate = int(bundle.sample_rate)
    wrapped = TorchaudioCTC(model, order, ratio / rate, rate, device, f"torchaudio {name} ({path})")
    return wrapped, tokenizer, foreign_config(rate)


def _load_sherpa(checkpoint: str, device: Any, case: str, punctuation: str) -> tuple[Any, Any, Any]:
    import onnx
    import onnxruntime

    path = checkpoint[len(SHERPA):] if checkpoint.startswith(SHERPA) else checkpoint
    tokens_path = os.path.join(os.path.dirname(os.path.abspath(path)), "tokens.txt")
    if not os.path.isfile(path) or not os.path.isfile(tokens_path):
        raise ConfigError(f"checkpoint {checkpoint}: a sherpa-onnx CTC model is a .onnx file with its tokens.txt "
                          f"beside it; {path if not os.path.isfile(path) else tokens_path} does not exist.")
    meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    model_type = meta.get("model_type", "wenet_ctc")
    if model_type not in SHERPA_TYPES:
        raise ConfigError(f"checkpoint {checkpoint}: model_type {model_type!r} (the file's metadata) is not read "
                          f"here; sherpa-onnx CTC files of model_type {', '.join(SHERPA_TYPES)} are.")
    profile = SHERPA_TYPES[model_type]
    normalize = "" if meta.get("normalize_type", "") in ("", "NA") else meta["normalize_type"]
    if profile.get("nemo") and meta.get("is_giga_am", "0") not in ("", "0"):
        raise ConfigError(f"checkpoint {checkpoint}: a GigaAM file (is_giga_am={meta['is_giga_am']} in its "
                          f"metadata), whose features are not read here; decode it with sherpa-onnx itself.")
    if normalize not in ("", "per_feature"):
        raise ConfigError(f"checkpoint {checkpoint}: normalize_type {normalize!r} (the file's metadata) is not "
                          f"read here, nor by sherpa-onnx; per_feature, NA or none are.")
    symbols: dict[int, str] = {}
    for line in Path(tokens_path).read_text(encoding="utf-8").splitlines():
        parts = line.rsplit(" ", 1) if line.strip() else []
        if len(parts) == 2 and parts[1].strip().isdigit():
            symbols[int(parts[1])] = parts[0] if parts[0] else " "
    listed = [symbols.get(i, f"<unused{i}>") for i in range(max(symbols) + 1)] if symbols else []
    named = [listed.index(b) for b in SHERPA_BLANKS if b in listed]  # as sherpa-onnx's recognizer finds it
    blank = named[0] if named else int(meta.get("blank_id", 0))
    ordered, order = blank_first(listed, blank)
    specials = {s for s in ordered if s.startswith("<") and s.endswith(">")}
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = max(1, min(4, os.cpu_count() or 1))
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    width = session.get_outputs()[0].shape[-1]
    if isinstance(width, int) and width != len(listed):
        raise ConfigError(f"checkpoint {checkpoint}: the model gives {width} log-probs per frame and {tokens_path} "
                          f"lists {len(listed)} tokens; give the tokens.txt exported with this model.")
    subsampling = int(meta.get("subsampling_factor", 4))
    unk = "<unk>" if "<unk>" in ordered else None
    # a letter list's word boundary; a BPE list's words start with their ▁ piece instead
    delimiter = "▁" if "▁" in ordered and not any(t.startswith("▁") and len(t) > 1 for t in ordered) else None
    tokenizer = VocabTokenizer(ordered, unk=unk, delimiter=delimiter, specials=specials, case=case,
                               punctuation=punctuation, where=tokens_path)
    shape = session.get_inputs()[0].shape  # (N, bins, T) for NeMo, (N, T, bins) else
    bins = shape[1] if profile.get("nemo") else shape[-1]
    dim = bins if isinstance(bins, int) else int(meta.get("feature_dim", 80))
    wrapped = SherpaOnnxCTC(session, profile, dim, order, 0.01 * subsampling, device,
                            f"sherpa-onnx {model_type} model {path}", normalize=normalize, subsampling=subsampling)
    return wrapped, tokenizer, foreign_config(16000)


__all__ = ["VocabTokenizer", "checkpoint_files", "foreign_kind", "load_foreign"]
