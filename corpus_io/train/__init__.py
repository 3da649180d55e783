"""Training: the DDP loop over the corpus-io loader and what only training needs.

Modules: ``trainer`` (the DDP training loop), ``steps`` (one forward + loss for training and validation, the
micro- and optimizer steps), ``optim`` (optimizer and scheduler builders), ``metrics`` (sums reduced across
ranks, TensorBoard, log lines), ``distributed`` (torchrun/env:// set-up and collectives), ``init_param``
(starting from another run's weights: fine-tuning), ``output_dir`` (a run's output_dir claimed),
``trained_keys`` (debug key records). The network, its front end, CMVN and checkpoints are in
:mod:`corpus_io.model`; decode, transcribe, export and serving in :mod:`corpus_io.infer`.
"""
