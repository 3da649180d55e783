"""Tables: manifests in and out.

``kaldi`` reads and writes Kaldi tables (``wav.scp``, ``text``, ``segments``, ...), ``manifest`` FunASR/WeNet
JSONL and ``scp2jsonl``/``jsonl2scp``, ``inputs`` detects the five input kinds every reading command takes
(FunASR, WeNet, Kaldi dir, NeMo, Lhotse, Lhotse Shar), ``shar`` reads and writes Lhotse Shar (inputs, loader
shards, index entries), ``exports`` writes NeMo and Lhotse manifests, ``corpora`` turns
corpus layouts (AISHELL-1, LibriSpeech) into Kaldi dirs, and ``synth`` writes espeak-ng corpora in these
layouts for tests, demos and benches.

May import: ``corpus_io.storage``, ``corpus_io.audio`` (lengths from headers), ``corpus_io.jobs``
(scp2jsonl as N jobs), ``corpus_io.config``, ``corpus_io.keys``, ``corpus_io.errors``; never shards, the
loader or anything above.
"""
