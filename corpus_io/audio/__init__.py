"""Audio: one source's samples and what is computed from them.

``io`` probes headers, decodes, encodes and resamples a source (a path, URL, pipe, Kaldi ark offset or
tar member), ``features`` computes Kaldi fbank/mfcc (per utterance and batched), ``augment`` draws and
applies spec_aug/spec_sub/spec_trim on feature batches.

May import: ``corpus_io.storage``, ``corpus_io.config``, ``corpus_io.keys``, ``corpus_io.errors``; never
tables, jobs or anything above.
"""


def __getattr__(name: str):
    """The old module's names (``from corpus_io.audio import probe``) until corpus-io 0.2, with a
    DeprecationWarning: they live in :mod:`corpus_io.audio.io`."""
    from corpus_io import _moved_attribute

    return _moved_attribute(__name__, name, "corpus_io.audio.io")

