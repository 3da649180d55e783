"""``corpus-io explore``: a corpus and results explorer in the browser.

``catalog`` builds a columnar catalog (Parquet, queried with DuckDB) of any input the toolkit reads,
``query`` answers page / sort / filter / histogram / dataset questions from it, ``results`` joins
``corpus-io decode`` outputs (per-utterance errors, aligned diffs), ``media`` serves audio byte ranges
straight from tar members and draws waveforms and spectrograms, ``server`` is the HTTP front (stdlib),
and ``static/`` is the page. This package imports the readers; nothing imports it but the CLI.
"""
