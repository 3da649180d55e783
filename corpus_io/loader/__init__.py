"""The streaming loader, whole: from a data.list to padded batches.

``read`` reads the lists, opens shards or raw lines (retries, the weighted mix of sources), ``partition``
assigns them to ranks, workers and epochs and keeps the resumable slot state, ``stages`` are the sample
stages (decode, resample, filter, features, tokenize, ...), ``batching`` builds and pads batches, ``build``
chains the stages from a config, ``rawlist`` reads a raw list by byte offsets, ``elastic`` re-splits a
checkpointed epoch over another world size, ``dataset`` is the IterableDataset and the resumable
DataLoader wrapper (``CorpusLoader``), ``workers`` starts and watches its worker processes, ``bench`` is
``bench-loader``; ``profile`` times the stages when asked.

May import: ``corpus_io.storage``, ``corpus_io.audio``, ``corpus_io.jobs``, ``corpus_io.tables``,
``corpus_io.shards``, ``corpus_io.tokenizer``, ``corpus_io.config``, ``corpus_io.keys``,
``corpus_io.errors``; never train, decoding or anything above.
"""
