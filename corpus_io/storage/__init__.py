"""Storage, the bottom wing: bytes in and out.

``urls`` opens local files, ``file://``, ``http(s)://``, ``s3://`` and pipes (every network wait bounded),
``files`` writes crash-safe outputs (temp name, then rename) and their sidecars, ``objects`` puts whole
objects on object storage, ``progress`` holds the progress bars, summaries and the parallel map.

May import: ``corpus_io.errors`` only. Every other wing builds on it (the order: tests/test_layering.py).
"""
